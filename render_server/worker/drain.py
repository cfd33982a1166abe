"""A worker's graceful drain: no new session, every session handed over, then leave.

A drain starts on SIGTERM or SIGINT (`render-server worker`), on `worker.drain` from signaling,
or on a spot VM's interruption notice (worker/preemption.py); whichever comes first starts it,
the others change nothing. The worker says `worker.draining` (reason, deadline), refuses new
sessions (no_capacity) and sends a `session.handoff` with the state of each session it has.
Signaling opens each one on another worker and then closes it here (`session.close`, "moved").
Handoffs are sent again every RESEND_S for the sessions still here, and after a reconnection,
since the bus between replicas may lose a message. The drain ends when no session is left
("drained") or at its deadline ("drain_timeout"); what happens then (`worker.leaving`, the
sessions still here closed, the process's exit) is the owner's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from render_server.protocol.worker import WorkerDraining
from render_server.worker.service import SessionService

log = logging.getLogger(__name__)

RESEND_S: Final = 5.0


class Drain:
    def __init__(
        self, service: SessionService, timeout_s: float, resend_s: float = RESEND_S
    ) -> None:
        self.service = service
        self.timeout_s = timeout_s
        self.resend_s = resend_s
        self.reason: str | None = None  # None: not draining
        self.outcome: str | None = None  # "drained" or "drain_timeout", once over
        self.finished = asyncio.Event()
        self._deadline = 0.0  # loop time
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self.reason is not None

    def remaining_s(self) -> float:
        if self.reason is None:
            return self.timeout_s
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def start(self, reason: str, deadline_s: float | None = None) -> bool:
        """Start draining (False, and nothing changes, if it has started already).
        `deadline_s`: from now, instead of the configured timeout."""
        if self.reason is not None:
            log.info("worker.drain_again", extra={"reason": reason, "draining_for": self.reason})
            return False
        seconds = self.timeout_s if deadline_s is None else max(0.0, deadline_s)
        loop = asyncio.get_running_loop()
        self.reason = reason
        self._deadline = loop.time() + seconds
        self.service.draining = True
        log.info(
            "worker.draining",
            extra={
                "reason": reason,
                "deadline_s": round(seconds, 1),
                "sessions": len(self.service.sessions),
            },
        )
        self._task = loop.create_task(self._run())
        return True

    async def announce(self) -> None:
        """`worker.draining` with the time left, and a handoff of each session: at the start,
        and again after a reconnection to signaling."""
        if self.reason is None or self.finished.is_set():
            return
        await self.service.send(WorkerDraining(self.reason, round(self.remaining_s(), 3)))
        await self.service.handoffs()

    async def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        service = self.service
        try:
            await self.announce()
            resend_at = loop.time() + self.resend_s
            while True:
                service.changed.clear()  # what changes from here on wakes the wait below
                if service.idle:
                    self.outcome = "drained"
                    break
                now = loop.time()
                if now >= self._deadline:
                    self.outcome = "drain_timeout"
                    break
                if now >= resend_at:
                    await service.handoffs()
                    resend_at = now + self.resend_s
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self._deadline, resend_at) - now):
                        await service.changed.wait()
        finally:
            if self.outcome is not None:
                log.info(
                    "worker.drain_over",
                    extra={"outcome": self.outcome, "sessions": len(service.sessions)},
                )
            self.finished.set()


__all__ = ["RESEND_S", "Drain"]
