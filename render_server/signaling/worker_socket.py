"""The signaling side of a worker's socket (`/worker`): registration, heartbeats, relaying.

A worker's socket may drop while the worker lives on (its replica died, the network blinked):
its sessions stream on, peer to peer, and it registers again through any replica with the same
`instance` nonce and the sessions it still serves. So a dropped socket is not a lost worker at
once: only if the worker has not come back within `RECONNECT_GRACE_S` are its sessions placed
elsewhere. A worker that drains says so (`worker.draining`: no new sessions) and says when it
leaves (`worker.leaving`: its remaining sessions are placed elsewhere at once). An outage of the
shared state (Redis) does not close the socket: the worker streams on and beats again later.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import replace

from aiohttp import WSMessage, WSMsgType, web

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import Error
from render_server.protocol.wire import encode_message
from render_server.protocol.worker import (
    FromWorker,
    Heartbeat,
    Register,
    Registered,
    WorkerDraining,
    WorkerLeaving,
    WorkerRequest,
    parse_from_worker,
)
from render_server.signaling.audit import audit
from render_server.signaling.auth import Identity
from render_server.signaling.context import SignalingContext
from render_server.signaling.faults import is_outage
from render_server.signaling.message_guard import MessageGuard
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.registry import WorkerInfo, WorkerStatus

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 10.0
RECONNECT_GRACE_S = 1.0  # a worker whose socket dropped registers again within this, or is lost
# A worker's own traffic: a heartbeat every second, and per session placed on it an `opened`, an
# `answer` and an `ended`; a burst of sessions starting at once stays far below these.
MESSAGE_RATE_PER_S = 200.0
MESSAGE_BURST = 400
GOING_AWAY = 1012  # "service restart": the worker registers through another replica at once


class WorkerSocket:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        ctx: SignalingContext,
        identity: Identity,
        pending_losses: set[asyncio.Task[None]] | None = None,
    ) -> None:
        self.ws = ws
        # losses waiting out their grace past this handler; the app cancels them on shutdown
        self.pending_losses = pending_losses if pending_losses is not None else set()
        self.ctx = ctx
        self.identity = identity
        self.info: WorkerInfo | None = None
        self.relay: WorkerRelay | None = None
        self.left = False  # said `worker.leaving`: nothing to wait for when the socket closes
        self.evicted = False  # closed by us (1008): lost at once
        # this socket's registration, told apart from the same worker's through another socket
        self.holder = f"{ctx.replica_id}/{uuid.uuid4().hex[:8]}"
        # requests wait for `worker.registered` to go first: registering serves the queue, and
        # a `session.open` the worker gets before it knows it is registered would be lost
        self._told_registered = asyncio.Event()
        # a worker token is not a licence to flood its replica with garbage
        self.guard = MessageGuard(
            ws, ctx.metrics, identity.subject, channel="worker_socket",
            rate_per_s=MESSAGE_RATE_PER_S, burst=MESSAGE_BURST,
        )  # fmt: skip

    async def run(self) -> None:
        try:
            if not await self._register():
                return
            async for msg in self.ws:
                try:
                    self.guard.admit()
                    await self._receive(msg)
                except ProtocolError as exc:
                    await self.guard.reject(exc)
                except Exception as exc:
                    if is_outage(exc):  # the worker streams on; its next beat tries again
                        self._outage(exc)
                    else:  # a bug of ours: answered and logged; the socket stays open
                        await self.guard.internal_error(
                            frame=msg.type.name,
                            worker=self.info.worker_id if self.info is not None else None,
                        )
                if self.guard.exhausted:  # closed for its conduct: no grace, it is lost now
                    await self.guard.close()
                    self.evicted = True
                    break
        finally:
            await self._closed()

    async def _closed(self) -> None:
        if self.info is None or self.relay is None:
            return
        try:
            await self.ctx.channels.leave_worker(self.info.worker_id)
        except Exception as exc:  # the bus forgets it anyway when it reconnects
            log.warning("worker.leave_failed", extra={"error": repr(exc)[:200]})
        if self.left or self.ctx.stopping:
            return  # gone on purpose, or this replica is stopping: the worker goes elsewhere
        if self.evicted:
            if await self._still_mine(self.info):
                await self.relay.lost("worker_evicted")
            return
        task = asyncio.get_running_loop().create_task(self._lost_unless_back(self.info, self.relay))
        self.pending_losses.add(task)
        task.add_done_callback(self.pending_losses.discard)

    async def _lost_unless_back(self, info: WorkerInfo, relay: WorkerRelay) -> None:
        """The socket dropped: unless the worker registers again in time (through any replica),
        its sessions are placed elsewhere."""
        await asyncio.sleep(RECONNECT_GRACE_S)
        try:
            if await self._still_mine(info):  # not back
                await relay.lost("worker_disconnected")
        except Exception as exc:  # an outage: the heartbeat timeout decides later
            log.warning("worker.loss_unsettled", extra={"worker": info.worker_id,
                                                        "error": repr(exc)[:200]})  # fmt: skip

    async def _register(self) -> bool:
        try:
            msg = await self.ws.receive(timeout=REGISTER_TIMEOUT_S)
            message = parse_from_worker(msg.data) if msg.type == WSMsgType.TEXT else None
        except (TimeoutError, ProtocolError) as exc:
            await self._refuse(f"register first: {exc}")
            return False
        if not isinstance(message, Register):
            await self._refuse("the first message must be worker.register")
            return False
        try:
            return await self._accept(message)
        except Exception as exc:
            if not is_outage(exc):
                raise
            self._outage(exc)
            await self.guard.send(
                encode_message(Error(ErrorCode.UNAVAILABLE, "shared state unreachable: retry"))
            )
            await self.ws.close(code=1013, message=b"try again later")  # the worker goes elsewhere
            return False

    async def _accept(self, message: Register) -> bool:
        existing = await self._registered(message.worker_id)
        comeback = (
            existing is not None
            and bool(message.instance)
            and existing.info.instance == message.instance
        )
        if existing is not None and not comeback:
            await self._refuse(f"worker id {message.worker_id!r} is already registered and alive")
            return False
        self.info = replace(WorkerInfo.of(message, self.holder), instance=message.instance,
                            draining=message.draining)  # fmt: skip
        self.relay = WorkerRelay(self.ctx, message.worker_id)
        await self.ctx.channels.on_worker(message.worker_id, self._to_socket)
        await self.relay.register(self.info, message.session_ids)
        audit("audit.worker.registered", worker=message.worker_id, slots=message.slots,
              subject=self.identity.subject, again=comeback,
              sessions=len(message.session_ids))  # fmt: skip
        await self.guard.send(encode_message(Registered(message.worker_id)))
        self._told_registered.set()
        return True

    async def _receive(self, msg: WSMessage) -> None:
        if msg.type == WSMsgType.TEXT:
            await self._handle(parse_from_worker(msg.data))
        elif msg.type == WSMsgType.BINARY:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "send JSON text frames")
        # ERROR: aiohttp has closed the socket (over the transport limit: 1009; a text frame
        # that is not UTF-8: 1007); the loop ends

    async def _handle(self, message: FromWorker) -> None:
        assert self.info is not None and self.relay is not None
        if isinstance(message, Heartbeat):
            if message.draining and not self.info.draining:
                await self._draining("heartbeat")
            await self.relay.heartbeat(self.info, message.load, message.session_ids)
            self.ctx.state_health.ok()
        elif isinstance(message, WorkerDraining):
            await self._draining(message.reason, message.deadline_s)
        elif isinstance(message, WorkerLeaving):
            self.left = True
            audit("audit.worker.leaving", worker=self.info.worker_id, reason=message.reason)
            await self.relay.lost(f"worker_{message.reason}"[:64])
        elif isinstance(message, Register):
            raise ProtocolError(ErrorCode.BAD_ORDER, "already registered")
        else:
            await self.relay.from_worker(message)

    async def _draining(self, reason: str, deadline_s: float | None = None) -> None:
        assert self.info is not None
        self.info = replace(self.info, draining=True)
        await self.ctx.registry.set_draining(self.info.worker_id, True)
        audit("audit.worker.draining", worker=self.info.worker_id, reason=reason,
              deadline_s=deadline_s)  # fmt: skip

    def _outage(self, exc: BaseException) -> None:
        # logged once per outage by StateHealth; each failed beat only here, quietly
        self.ctx.state_health.failed(exc)
        worker = self.info.worker_id if self.info else None
        log.debug("worker_socket.state_unreachable", extra={"worker": worker, "error": repr(exc)})

    async def _still_mine(self, info: WorkerInfo) -> bool:
        """The worker is registered through this socket still (it has not come back through
        another one, nor gone)."""
        status = await self._registered(info.worker_id)
        return status is not None and status.info.replica == info.replica

    async def _registered(self, worker_id: str) -> WorkerStatus | None:
        workers = await self.ctx.registry.workers()
        return next((w for w in workers if w.info.worker_id == worker_id), None)

    async def _to_socket(self, request: WorkerRequest) -> None:
        await self._told_registered.wait()
        await self.guard.send(encode_message(request))

    async def _refuse(self, reason: str) -> None:
        audit("audit.worker.refused", subject=self.identity.subject, reason=reason)
        await self.guard.send(encode_message(Error(ErrorCode.BAD_ORDER, reason)))
        await self.ws.close(code=1008, message=reason[:120].encode())
