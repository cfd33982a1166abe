"""`serve`'s worker, attached to its signaling replica in process: a `WorkerLink`
(protocol/worker.py) on the replica's registry, bus and relay.

The worker registers in the registry and gets its requests on its bus channel as a remote
worker's socket does, so the signaling side has one code path for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from render_server.protocol.errors import ProtocolError
from render_server.protocol.worker import (
    Heartbeat,
    Register,
    ToSignaling,
    WorkerDraining,
    WorkerLeaving,
    WorkerRequest,
)
from render_server.signaling.context import SignalingContext
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.registry import WorkerInfo

log = logging.getLogger(__name__)


class LocalWorkerLink:
    def __init__(self, ctx: SignalingContext) -> None:
        self.ctx = ctx
        self._info: WorkerInfo | None = None
        self._relay: WorkerRelay | None = None

    async def open(self, registration: Register, deliver: Callable[[WorkerRequest], None]) -> None:
        worker_id = registration.worker_id
        self._info = WorkerInfo.of(registration, self.ctx.replica_id)
        self._relay = WorkerRelay(self.ctx, worker_id)

        async def receive(request: WorkerRequest) -> None:
            deliver(request)

        await self.ctx.channels.on_worker(worker_id, receive)
        await self._relay.register(self._info, registration.session_ids)

    async def heartbeat(self, beat: Heartbeat) -> None:
        assert self._relay is not None and self._info is not None, "open() first"
        await self._relay.heartbeat(self._info, beat.load, beat.session_ids)

    async def send(self, reply: ToSignaling) -> None:
        assert self._relay is not None and self._info is not None, "open() first"
        if isinstance(reply, WorkerDraining):
            self._info = replace(self._info, draining=True)
            await self.ctx.registry.set_draining(self._info.worker_id, True)
            return
        if isinstance(reply, WorkerLeaving):
            await self._relay.lost(f"worker_{reply.reason}"[:64])
            return
        try:
            await self._relay.from_worker(reply)
        except ProtocolError:
            # in process nobody forges: a reply refused here (for another worker's session) is
            # a bug of ours; logged with its traceback, and the embedded worker goes on
            log.exception(
                "local_worker.reply_refused",
                extra={"session": reply.session_id, "worker": self._relay.worker_id,
                       "type": reply.type},
            )  # fmt: skip

    async def close(self) -> None:
        if self._info is not None:
            await self.ctx.channels.leave_worker(self._info.worker_id)
