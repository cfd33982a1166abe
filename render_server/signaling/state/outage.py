"""A replica's view of its shared state (the registry, the session store, the bus on Redis): is
it answering, since when not, and the last fleet figures read from it.

Redis may go away for seconds (a restart, a failover, a stalled host) while the replica keeps
running its streams. The replica's loops note each outcome here (`ok()`, `failed(exc)`), and
what depends on the state being there asks: `/readyz` (`up`), `/healthz` (`down_for()`, the
last `fleet`), and the worker expiry, which must not count the seconds of an outage against
workers that could not heartbeat meanwhile (`stable_for()`).

The first failure of an outage is logged once as a WARNING, its end once as INFO with its
length: a loop that notes its failures here need not log each one louder than DEBUG.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from render_server.signaling.faults import OUTAGE_ERRORS
from render_server.signaling.state.registry import Registry

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Fleet:
    """The registered workers, their slots, the free ones and the sessions on them, as the
    registry had them when read (`read_at`, on the monotonic clock)."""

    workers: int
    slots: int
    free: int
    sessions: int
    read_at: float = 0.0

    @classmethod
    async def of(cls, registry: Registry, clock: Callable[[], float] = time.monotonic) -> Fleet:
        workers = await registry.workers()
        return cls(
            workers=len(workers),
            slots=sum(w.info.slots for w in workers),
            free=sum(w.free for w in workers),
            sessions=sum(len(w.sessions) for w in workers),
            read_at=clock(),
        )


class StateHealth:
    """Whether the shared state answered the last time anyone asked, from one replica's view.

    Up until a failure is noted; down from then until a success is noted. Not thread-safe:
    notes come from the replica's event loop.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._started = clock()
        self._last_failure: float | None = None
        self.down_since: float | None = None  # on `clock`; None while up
        self.last_error = ""  # the last failure, for /readyz and logs
        self.fleet: Fleet | None = None  # the last fleet figures read (`remember`)

    @property
    def up(self) -> bool:
        return self.down_since is None

    def ok(self) -> None:
        """The state answered."""
        if self.down_since is not None:
            log.info("state.recovered", extra={"outage_s": round(self.down_for(), 3)})
            self.down_since = None

    def failed(self, exc: BaseException) -> None:
        """The state did not answer (`exc`: what the attempt raised)."""
        now = self._clock()
        self._last_failure = now
        self.last_error = repr(exc)[:200]
        if self.down_since is None:
            self.down_since = now
            log.warning("state.unavailable", extra={"error": self.last_error})

    def down_for(self) -> float:
        """Seconds since the outage began; 0 while up."""
        return 0.0 if self.down_since is None else max(0.0, self._clock() - self.down_since)

    def stable_for(self) -> float:
        """Seconds since the last failure noted, or since this view began if none was."""
        since = self._started if self._last_failure is None else self._last_failure
        return max(0.0, self._clock() - since)

    def remember(self, fleet: Fleet) -> None:
        """Keep `fleet` as the last known figures (read when the state answered)."""
        self.fleet = fleet

    def fleet_age(self) -> float | None:
        """Seconds since the last fleet figures were read; None if never."""
        return None if self.fleet is None else max(0.0, self._clock() - self.fleet.read_at)

    async def call(self, aw: Awaitable[T], timeout_s: float) -> T:
        """Await `aw` for at most `timeout_s` and note the outcome: its result, or what it raised
        (TimeoutError when it took too long). An outage's errors (`faults.OUTAGE_ERRORS`) are
        noted as failures; any other exception is a bug, not an outage, and passes unnoted.
        `asyncio.timeout`, not 3.11's `wait_for`, which returns the result when a cancellation
        lands as `aw` completes: the sweep then went on, and the replica's shutdown waited on
        it forever (a CI test's teardown hung 180 s so)."""
        try:
            async with asyncio.timeout(timeout_s):
                result = await aw
        except OUTAGE_ERRORS as exc:
            self.failed(exc)
            raise
        self.ok()
        return result

    async def check(self, aw: Awaitable[object], timeout_s: float) -> bool:
        """`call`, as whether `aw` answered in time (anything it raised counts as not)."""
        try:
            await self.call(aw, timeout_s)
        except OUTAGE_ERRORS:
            return False
        except Exception:
            log.exception("state.check_failed")
            return False
        return True
