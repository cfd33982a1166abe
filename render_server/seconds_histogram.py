"""Durations counted into a Prometheus histogram's buckets by hand.

The process-wide clocks (`gc_pauses`, `loop_lag`) keep one of these each, outside any registry:
tests and servers make many registries in one process, and each reads the same counts through
a collector of its own.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


class SecondsHistogram:
    """Observations bucketed by `bounds` (ascending, the last `math.inf`), and their sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.total_s = 0.0

    def record(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_s += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative counts by bound as `HistogramMetricFamily.add_metric` takes them."""
        out: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if math.isinf(bound) else f"{bound:g}", cumulative))
        return out
