"""The worker's clock seen from a client: ping/pong on the `input` data channel.

A client sends `ping` with its own clock; the worker answers `pong` with its clock (`w`) at once.
Half the round trip after the ping left is when the worker read its clock, so the pong with the
smallest round trip gives the least skewed offset (docs/data-channel.md, "ping → pong").
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
    """Worker clock − client clock, from the ping/pong with the smallest round trip among the
    last `window`: the one least delayed on either leg, so the least skewed."""

    def __init__(self, window: int = 20) -> None:
        self.samples: deque[ClockSample] = deque(maxlen=window)
        self._best: ClockSample | None = None  # the smallest round trip among `samples`
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

    def pong(self, message: dict[str, Any], received_ms: float) -> bool:
        """Take the worker's `pong` (received at `received_ms`); False if it answers no ping
        of ours."""
        ping_id, worker = message.get("id"), message.get("w")
        sent = self._pending.pop(ping_id, None) if isinstance(ping_id, int) else None
        if sent is None or isinstance(worker, bool) or not isinstance(worker, int | float):
            return False
        self.add(sent, float(worker), received_ms)
        return True

    def add(self, sent_ms: float, worker_ms: float, received_ms: float) -> None:
        if received_ms < sent_ms:
            raise ValueError("a pong cannot arrive before its ping left")
        self.samples.append(ClockSample(sent_ms, worker_ms, received_ms))
        # once per pong, not per frame: the best may just have left the window
        self._best = min(self.samples, key=lambda sample: sample.rtt)

    @property
    def best(self) -> ClockSample:
        if self._best is None:
            raise LookupError("no ping answered yet: the clocks are not aligned")
        return self._best

    @property
    def offset(self) -> float:
        return self.best.offset

    def to_worker(self, client_ms: float) -> float:
        return client_ms + self.offset

    def summary(self) -> dict[str, float]:
        """The alignment in use, for a report: its offset and round trip, and the samples."""
        best = self.best
        return {
            "offset_ms": round(best.offset, 3),
            "rtt_ms": round(best.rtt, 3),
            "samples": len(self.samples),
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
