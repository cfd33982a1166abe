"""`serve`'s worker, in the signaling replica's process: its sessions' service on a `WorkerLink`
(protocol/worker.py) instead of a socket. `cli/process.py` gives it the signaling side's link.

A failing heartbeat (the registry out of reach for a moment) is logged and the next one tried:
the worker's heartbeats must outlive the outage. A drain asked of it (`worker.drain`) hands its
sessions over and leaves as a worker process would, but the process goes on serving signaling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from render_server.config import DRAIN_TIMEOUT_S
from render_server.protocol.worker import WorkerLeaving, WorkerLink
from render_server.worker.drain import Drain
from render_server.worker.local import LocalWorker
from render_server.worker.pool import worker_service
from render_server.worker.pool_children import WorkerPool

log = logging.getLogger(__name__)


class EmbeddedWorker:
    def __init__(
        self,
        link: WorkerLink,
        worker: LocalWorker,
        heartbeat_s: float,
        labels: tuple[str, ...] = (),
        region: str | None = None,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
        pool: WorkerPool | None = None,
    ) -> None:
        self.link = link
        self.worker = worker
        self.heartbeat_s = heartbeat_s
        self.service = worker_service(worker, link.send, labels, region, pool)
        self.service.on_drain = self.start_drain
        self.drain = Drain(self.service, drain_timeout_s)
        self.left = False
        self._beat: asyncio.Task[None] | None = None
        self._leave: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.link.open(self.service.registration(), self.service.submit)
        self._beat = asyncio.get_running_loop().create_task(self._heartbeats())

    def start_drain(self, reason: str, deadline_s: float | None = None) -> bool:
        if not self.drain.start(reason, deadline_s):
            return False
        self._leave = asyncio.get_running_loop().create_task(self._leave_when_drained())
        return True

    async def stop(self) -> None:
        for task in (self._beat, self._leave):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.drain.cancel()
        await self.service.close_all("server_stopping")
        await self.service.cancel()
        await self.link.close()

    async def _leave_when_drained(self) -> None:
        await self.drain.finished.wait()
        if self.drain.outcome is None:
            return
        self.left = True
        if self._beat is not None:
            self._beat.cancel()
        await self.link.send(WorkerLeaving(self.drain.outcome))
        await self.service.close_all(self.drain.outcome)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self.link.heartbeat(self.service.heartbeat())
            except Exception as exc:  # ConnectionError, RedisError...: the next one may pass
                log.warning(
                    "worker.heartbeat_failed",
                    extra={"error": f"{type(exc).__name__}: {exc}"[:300]},
                )


__all__ = ["EmbeddedWorker"]
