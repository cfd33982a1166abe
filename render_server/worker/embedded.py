"""`serve`'s worker, in the signaling replica's process: a WorkerService on a `WorkerLink`
(protocol/worker.py) instead of a socket. `cli/process.py` gives it the signaling side's link."""

from __future__ import annotations

import asyncio

from render_server.protocol.worker import WorkerLink
from render_server.worker.local import LocalWorker
from render_server.worker.service import WorkerService


class EmbeddedWorker:
    def __init__(
        self,
        link: WorkerLink,
        worker: LocalWorker,
        heartbeat_s: float,
        labels: tuple[str, ...] = (),
        region: str | None = None,
    ) -> None:
        self.link = link
        self.worker = worker
        self.heartbeat_s = heartbeat_s
        self.service = WorkerService(worker, link.send, labels, region)
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.link.open(self.service.registration(), self.service.submit)
        self._beat = asyncio.get_running_loop().create_task(self._heartbeats())

    async def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        await self.service.close_all("server_stopping")
        await self.link.close()

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self.link.heartbeat(self.service.heartbeat())


__all__ = ["EmbeddedWorker"]
