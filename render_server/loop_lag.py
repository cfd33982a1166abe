"""How late this process's event loop runs what is due: every stream it sends waits as long.

A worker process sends all its sessions' packets from one event loop. While the loop is held (a
long callback, a full garbage collection, the process frozen or descheduled), every frame tick
due meanwhile runs late, and each of its streams freezes together. A timer due every
`INTERVAL_S`, on the grid the sessions' ticks share (render_server/ticks.py: no wake-up of its
own while they tick), measures how late the loop ran it. Operators see
`python_event_loop_lag_seconds` on /metrics (a worker pool's children each under their own
labels), and each lateness of `STALL_S` or more is logged as `loop.stalled`.

A stall shorter than the interval may fall between two timers, and one longer is seen as the
lateness of the first timer due in it: the histogram is how late timers ran, sampled
`1 / INTERVAL_S` times a second, not a record of every stall.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections.abc import Iterator
from typing import Final

from prometheus_client.core import HistogramMetricFamily, Metric

from render_server.seconds_histogram import SecondsHistogram
from render_server.ticks import next_on_grid

__all__ = ["LoopLagCollector", "watch_event_loop"]

log = logging.getLogger(__name__)

INTERVAL_S: Final = 0.05  # a multiple of 1/60 s: the 30 and 60 fps ticks' grid points
STALL_S: Final = 0.1  # a lateness logged: three frame intervals at 30 fps
BUCKETS_S: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, math.inf)

_lateness = SecondsHistogram(BUCKETS_S)  # the process's: every registry reads it
_watched: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def watch_event_loop() -> None:
    """Measure the running loop's lateness from now on, until it closes (once per loop).

    A chain of `call_at` handles, not a task: a loop closed without cancelling its tasks (a
    test's) drops the next handle silently."""
    loop = asyncio.get_running_loop()
    if loop in _watched:
        return
    _watched.add(loop)

    def due(at: float) -> None:
        now = loop.time()
        lag = max(0.0, now - at)  # asyncio may run a timer up to its clock resolution early
        _lateness.record(lag)
        if lag >= STALL_S:
            log.warning("loop.stalled", extra={"late_ms": round(lag * 1000, 1)})
        following = next_on_grid(now, INTERVAL_S)
        loop.call_at(following, due, following)

    first = next_on_grid(loop.time(), INTERVAL_S)
    loop.call_at(first, due, first)


class LoopLagCollector:
    """A prometheus-client collector of this process's event-loop lateness."""

    def collect(self) -> Iterator[Metric]:
        lag = HistogramMetricFamily(
            "python_event_loop_lag_seconds",
            f"How late this process's event loop ran a timer due every {INTERVAL_S * 1000:g} "
            "ms: every stream the process sends waits as long",
        )
        lag.add_metric([], _lateness.buckets(), _lateness.total_s)
        yield lag
