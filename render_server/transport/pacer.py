"""The pacing queue: a frame's packets leave at the estimated rate, not in one burst.

aiortc hands every packet of a frame to the socket at once: a 4K keyframe is hundreds of
packets in a millisecond, which a bottleneck's queue drops or holds all together, and which
blurs the arrival times a delay-based estimate reads. Packets queue here instead and leave in
bursts of at most `BURST_S` of the pacing rate (libwebrtc's pacer runs every 5 ms),
retransmissions first. A queue whose oldest packet has waited near `MAX_QUEUE_S` drains faster
than the rate (libwebrtc raises the rate to meet its queue-time limit the same way): a late
frame is worth less than a dropped one.

Sans-IO: times are passed in (seconds); `send_path` drives it from the event loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Final

BURST_S: Final = 0.005
MAX_QUEUE_S: Final = 0.25
MIN_DRAIN_S: Final = 0.02  # the queue-time limit raises the rate to empty it in this, at least
MTU_BYTES: Final = 1300  # a burst allows one whole packet however low the rate


@dataclass(slots=True)
class QueuedPacket:
    data: bytearray
    enqueued: float
    retransmission: bool
    kind: str | None = None  # what the sender counts it as, where it says (FEC)


class PacingQueue:
    """Packets waiting to leave, and the budget that lets them."""

    def __init__(self, rate: int) -> None:
        self.rate = max(1, rate)  # bits/s
        self._media: deque[QueuedPacket] = deque()
        self._retransmissions: deque[QueuedPacket] = deque()
        self._bytes = 0
        self._budget = 0.0  # bytes that may leave now; negative after a packet overdrew it
        self._updated: float | None = None

    def __len__(self) -> int:
        return len(self._media) + len(self._retransmissions)

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def queue_delay(self, now: float) -> float:
        """How long the oldest packet has waited (0 for an empty queue)."""
        media, resent = self._media, self._retransmissions
        if media and resent:
            return now - min(media[0].enqueued, resent[0].enqueued)
        if media or resent:
            return now - (media or resent)[0].enqueued
        return 0.0

    def set_rate(self, rate: int) -> None:
        self.rate = max(1, rate)

    def push(
        self, data: bytearray, now: float, retransmission: bool = False, kind: str | None = None
    ) -> None:
        if not self:
            self._refill(now)  # an idle queue's budget was capped meanwhile
        queue = self._retransmissions if retransmission else self._media
        queue.append(QueuedPacket(data, now, retransmission, kind))
        self._bytes += len(data)

    def pop(self, now: float) -> list[QueuedPacket]:
        """The packets that may leave at `now`, in order: retransmissions, then media."""
        self._refill(now)
        ready: list[QueuedPacket] = []
        while self and self._budget > 0:
            queue = self._retransmissions or self._media
            packet = queue.popleft()
            self._bytes -= len(packet.data)
            self._budget -= len(packet.data)
            ready.append(packet)
        return ready

    def wait(self, now: float) -> float | None:
        """Seconds until the next packet may leave; None while the queue is empty."""
        if not self:
            return None
        self._refill(now)
        if self._budget > 0:
            return 0.0
        return -self._budget * 8 / self._effective_rate(now)

    def spend(self, size: int, now: float) -> None:
        """Count `size` bytes sent outside the queue (a probe's padding) against the budget."""
        self._refill(now)
        self._budget -= size

    def _effective_rate(self, now: float) -> float:
        left = max(MIN_DRAIN_S, MAX_QUEUE_S - self.queue_delay(now))
        return max(float(self.rate), self._bytes * 8 / left)

    def _refill(self, now: float) -> None:
        if self._updated is not None and now > self._updated:
            rate = self._effective_rate(now)
            burst = max(MTU_BYTES, rate * BURST_S / 8)
            self._budget = min(burst, self._budget + (now - self._updated) * rate / 8)
        elif self._updated is None:
            self._budget = MTU_BYTES  # the first packet leaves at once, the rest at the rate
        self._updated = now if self._updated is None else max(self._updated, now)
