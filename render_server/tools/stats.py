"""Percentiles: the one way the measuring tools and benchmarks summarise a set of samples."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

PERCENTILES: Final = (50, 95, 99)


def percentile(values: Iterable[float], q: float) -> float:
    """The `q`-th percentile (0..100), linear between ranks; ValueError for no values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    return _rank(ordered, q / 100)


def median_p95(values: Iterable[float]) -> tuple[float, float]:
    """The median and the 95th percentile (linear between ranks); ValueError for no values."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    return _rank(ordered, 0.5), _rank(ordered, 0.95)


def percentiles(values: Iterable[float], ndigits: int = 3) -> dict[str, float] | None:
    """p50/p95/p99 (linear between ranks), mean and count; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    out: dict[str, float] = {f"p{q}": round(_rank(ordered, q / 100), ndigits) for q in PERCENTILES}
    out["mean"] = round(sum(ordered) / len(ordered), ndigits)
    out["count"] = len(ordered)
    return out


def _rank(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
