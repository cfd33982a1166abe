"""How long this process's garbage collections stop it, and what is frozen out of them.

A collection stops the whole process: every stream its event loop sends waits for it. A full
collection walks every tracked object that is not frozen (`memory.settle_heap`), so one in a
process that never froze what it loaded at start took 90-130 ms (a worker pool's child at
8 × 4K60: ~210k objects), a freeze of each of its streams. Operators see it here:
`python_gc_pause_seconds` by generation, and `python_gc_frozen_objects`.

The timing hook is the process's own (`gc.callbacks`, installed once); each metrics registry
reads it through a collector of its own (tests run many registries in one process).
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric

from render_server.memory import frozen_objects
from render_server.seconds_histogram import SecondsHistogram

__all__ = ["GcPauseCollector"]

BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, math.inf)
GENERATIONS = 3


class _PauseClock:
    """Times each collection from the hook's "start" to its "stop"."""

    def __init__(self) -> None:
        self.generations = [SecondsHistogram(BUCKETS_S) for _ in range(GENERATIONS)]
        self._started: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:  # installed during a collection
            return
        elapsed = time.perf_counter() - self._started
        self._started = None
        self.generations[info["generation"]].record(elapsed)


_clock: _PauseClock | None = None


def _process_clock() -> _PauseClock:
    global _clock
    if _clock is None:
        _clock = _PauseClock()
        gc.callbacks.append(_clock)
    return _clock


class GcPauseCollector:
    """A prometheus-client collector of this process's collection pauses and frozen objects."""

    def __init__(self) -> None:
        self.clock = _process_clock()

    def collect(self) -> Iterator[Metric]:
        pauses = HistogramMetricFamily(
            "python_gc_pause_seconds",
            "Time the garbage collector stopped this process, by generation (2: a full "
            "collection, which walks every tracked object not frozen at start)",
            labels=["generation"],
        )
        for generation, histogram in enumerate(self.clock.generations):
            pauses.add_metric([str(generation)], histogram.buckets(), histogram.total_s)
        yield pauses
        yield GaugeMetricFamily(
            "python_gc_frozen_objects",
            "Objects frozen out of the collector's work once the process had started "
            "(counted when they were frozen)",
            value=frozen_objects(),
        )
