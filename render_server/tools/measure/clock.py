"""The worker's clock seen from a client: ping/pong on the `input` data channel.

A client sends `ping` with its own clock; the worker answers `pong` with its clock (`w`) when it
handles the ping (docs/data-channel.md, "ping → pong"). The worker read `w` after the ping left
and before the pong came back, so each round trip bounds the offset (worker − client) between
`w − received` and `w − sent`; the true offset lies in every one of these intervals at once.

Taking half the round trip instead is right only where both legs wait alike. A busy worker or
client makes them differ: one side's event loop holds the ping, the other's the pong. On one
host, where the true offset is 0, the loaded streams of two scaling runs read offsets up to
9.9 ms off from the fastest round trip of each (README, Latency). The intersection of the
recent intervals is as narrow as the quickest ping leg and the quickest pong leg seen, even
where these came in different round trips, and its middle is the estimate (4.9 ms off at
most in the same runs).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from render_server.protocol.timing import now_ms

MAX_PENDING_PINGS: Final = 64
PING_BURST: Final = 5  # pings at the start, PING_BURST_GAP_S apart, before the steady ones
PING_BURST_GAP_S: Final = 0.02


@dataclass(frozen=True, slots=True)
class ClockSample:
    sent_ms: float  # client clock
    worker_ms: float
    received_ms: float  # client clock

    @property
    def rtt(self) -> float:
        return self.received_ms - self.sent_ms

    @property
    def offset(self) -> float:
        """worker − client, assuming the pong took half the round trip."""
        return self.worker_ms - (self.sent_ms + self.received_ms) / 2


class ClockOffset:
    """Worker clock − client clock from the last `window` ping/pongs: the middle of the
    intersection of their intervals. Where the intervals do not meet (a clock stepped, or the
    two drift apart faster than the window forgives), the middle of the fastest round trip's."""

    def __init__(self, window: int = 20) -> None:
        self.samples: deque[ClockSample] = deque(maxlen=window)
        self._best: ClockSample | None = None  # the smallest round trip among `samples`
        self._bounds: tuple[float, float] | None = None  # the intersection; None: empty
        self._pending: dict[int, float] = {}  # ping id → when it left
        self._next_id = 0

    def ping(self, sent_ms: float) -> dict[str, Any]:
        """The next `ping` message for the data channel, sent at `sent_ms` (client clock),
        remembered until its pong."""
        self._next_id += 1
        self._pending[self._next_id] = sent_ms
        if len(self._pending) > MAX_PENDING_PINGS:  # pongs that never came
            del self._pending[next(iter(self._pending))]
        return {"type": "ping", "id": self._next_id, "t": sent_ms}

    def pong(
        self, message: dict[str, Any], received_ms: float, stamped_ms: float | None = None
    ) -> bool:
        """Take the worker's `pong` (read at `received_ms`); False if it answers no ping of
        ours. `stamped_ms`, where known, is when its datagram reached the host (the kernel's
        stamp): the tighter bound, taken where it lies between the ping's send and the read (a
        stamp outside that is a stepped clock's, and the read's time stands)."""
        ping_id, worker = message.get("id"), message.get("w")
        sent = self._pending.pop(ping_id, None) if isinstance(ping_id, int) else None
        if sent is None or isinstance(worker, bool) or not isinstance(worker, int | float):
            return False
        if stamped_ms is not None and sent <= stamped_ms < received_ms:
            received_ms = stamped_ms
        self.add(sent, float(worker), received_ms)
        return True

    def add(self, sent_ms: float, worker_ms: float, received_ms: float) -> None:
        if received_ms < sent_ms:
            raise ValueError("a pong cannot arrive before its ping left")
        self.samples.append(ClockSample(sent_ms, worker_ms, received_ms))
        # once per pong, not per frame: a sample that set a bound may just have left the window
        self._best = min(self.samples, key=lambda sample: sample.rtt)
        low = max(sample.worker_ms - sample.received_ms for sample in self.samples)
        high = min(sample.worker_ms - sample.sent_ms for sample in self.samples)
        self._bounds = (low, high) if low <= high else None

    @property
    def best(self) -> ClockSample:
        if self._best is None:
            raise LookupError("no ping answered yet: the clocks are not aligned")
        return self._best

    @property
    def offset(self) -> float:
        best = self.best
        if self._bounds is None:
            return best.offset
        low, high = self._bounds
        return (low + high) / 2

    @property
    def error_bound(self) -> float:
        """How far `offset` can be from the truth (ms): half the intersection's width, or
        half the fastest round trip where the intervals do not meet."""
        best = self.best
        if self._bounds is None:
            return best.rtt / 2
        low, high = self._bounds
        return (high - low) / 2

    def to_worker(self, client_ms: float) -> float:
        return client_ms + self.offset

    def summary(self) -> dict[str, float | bool]:
        """The alignment in use, for a report: its offset and how far off it can be, the
        fastest round trip, the samples, and whether their intervals met."""
        return {
            "offset_ms": round(self.offset, 3),
            "error_bound_ms": round(self.error_bound, 3),
            "rtt_ms": round(self.best.rtt, 3),
            "samples": len(self.samples),
            "intervals_met": self._bounds is not None,
        }


async def ping_burst(send: Callable[[dict[str, Any]], None], clock: ClockOffset) -> None:
    """`PING_BURST` pings through `send`, `PING_BURST_GAP_S` apart: a first alignment."""
    for _ in range(PING_BURST):
        send(clock.ping(now_ms()))
        await asyncio.sleep(PING_BURST_GAP_S)


async def ping_every(
    send: Callable[[dict[str, Any]], None], clock: ClockOffset, interval: float
) -> None:
    """A ping through `send` every `interval` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        send(clock.ping(now_ms()))
