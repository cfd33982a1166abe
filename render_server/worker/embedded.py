"""`serve`'s worker, attached to the signaling replica in process instead of over a socket.

It registers in the registry and listens on its bus channel like a remote worker does, so the
signaling side has one code path for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from render_server.protocol.signaling import ProtocolError
from render_server.protocol.worker import FromWorker, parse_to_worker
from render_server.signaling.context import SignalingContext, worker_channel
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.registry import WorkerInfo
from render_server.worker.local import LocalWorker
from render_server.worker.service import WorkerService

log = logging.getLogger(__name__)


class EmbeddedWorker:
    def __init__(
        self,
        ctx: SignalingContext,
        worker: LocalWorker,
        heartbeat_s: float,
        labels: tuple[str, ...] = (),
        region: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.worker = worker
        self.heartbeat_s = heartbeat_s
        self.relay = WorkerRelay(ctx, worker.worker_id)
        self.service = WorkerService(worker, self._from_worker, labels, region)
        self._beat: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.ctx.bus.subscribe(worker_channel(self.worker.worker_id), self._to_worker)
        await self.relay.register(self._info())
        self._beat = asyncio.get_running_loop().create_task(self._heartbeats())

    async def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        await self.service.close_all("server_stopping")
        await self.ctx.bus.unsubscribe(worker_channel(self.worker.worker_id))

    def _info(self) -> WorkerInfo:
        return self.service.registration().info(self.ctx.replica_id)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self.relay.heartbeat(self._info(), self.service.heartbeat().load)

    async def _to_worker(self, doc: dict[str, Any]) -> None:
        self.service.submit(parse_to_worker(json.dumps(doc)))

    async def _from_worker(self, message: FromWorker) -> None:
        with contextlib.suppress(ProtocolError):  # in process, there is nobody to forge
            await self.relay.from_worker(message)


__all__ = ["EmbeddedWorker"]
