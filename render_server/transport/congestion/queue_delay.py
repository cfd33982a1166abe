"""The standing queue on the path, and how far under the estimate to send to drain it.

GoogCC cuts to 0.85 × the acknowledged rate on overuse, which stops the bottleneck queue from
growing but drains what a capacity drop left in it only with the remaining 15 %: 250 ms of
queue at 2 Mbit/s take about 1.5 s, and an interactive stream shows every frame that much late.
Here the queue is measured and drained on purpose, as delay-based senders after TCP Vegas do:
the one-way delay of each acknowledged packet (arrival on the receiver's clock − send time on
ours: an unknown offset plus path delay plus queueing) against its minimum over the last
`BASE_WINDOW_S` is the queueing delay; the encoder is asked for `factor` × the estimate, so
that what stands over `ALLOWANCE_S` drains within `DRAIN_S`.

The lowest delay of each feedback report is the sample (the least-queued packet: one late
packet is jitter, a report's every packet late is a queue). A sample `CLOCK_JUMP_S` above the
base is a jump of the receiver's clock, not a queue: the base starts again from it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

from .types import PacketResult

BASE_WINDOW_S: Final = 10.0  # the path's own delay: the minimum over this long
BUCKET_S: Final = 1.0  # the window's minimum is kept per bucket of this long
ALLOWANCE_S: Final = 0.02  # queueing this small is jitter, or a frame's own burst
DRAIN_S: Final = 0.5  # what stands above the allowance is sent off within this
MIN_FACTOR: Final = 0.5  # never ask the encoder for less than half the estimate to drain
STALE_S: Final = 1.0  # a sample older than this says nothing about the queue now
CLOCK_JUMP_S: Final = 3.0


class QueueDelay:
    def __init__(self) -> None:
        self._buckets: deque[tuple[float, float]] = deque()  # (bucket start, lowest delay)
        self._latest: tuple[float, float] | None = None  # (when, the report's lowest delay)

    @property
    def base(self) -> float | None:
        return min((low for _, low in self._buckets), default=None)

    def queue(self, now: float) -> float:
        """Seconds of queueing on the path at the latest report (0 when unknown or stale)."""
        base = self.base
        if self._latest is None or base is None or now - self._latest[0] > STALE_S:
            return 0.0
        return max(0.0, self._latest[1] - base)

    def factor(self, now: float) -> float:
        """The share of the estimate to send at now: 1.0 unless a queue stands to drain."""
        excess = self.queue(now) - ALLOWANCE_S
        if excess <= 0:
            return 1.0
        return max(MIN_FACTOR, 1.0 - excess / DRAIN_S)

    def update(self, now: float, received: Sequence[PacketResult]) -> None:
        if not received:
            return
        delay = min(r.arrival - r.sent.send_time for r in received)
        base = self.base
        if base is not None and delay - base > CLOCK_JUMP_S:
            self._buckets.clear()
        start = now - now % BUCKET_S
        if self._buckets and self._buckets[-1][0] == start:
            self._buckets[-1] = (start, min(self._buckets[-1][1], delay))
        else:
            self._buckets.append((start, delay))
        while self._buckets and self._buckets[0][0] <= now - BASE_WINDOW_S - BUCKET_S:
            self._buckets.popleft()
        self._latest = (now, delay)
