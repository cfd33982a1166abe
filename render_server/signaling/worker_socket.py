"""The signaling side of a worker's socket (`/worker`): registration, heartbeats, relaying."""

from __future__ import annotations

from aiohttp import WSMessage, WSMsgType, web

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import Error
from render_server.protocol.wire import encode_message
from render_server.protocol.worker import (
    FromWorker,
    Heartbeat,
    Register,
    Registered,
    SessionRequest,
    parse_from_worker,
)
from render_server.signaling.audit import audit
from render_server.signaling.auth import Identity
from render_server.signaling.context import SignalingContext
from render_server.signaling.message_guard import MessageGuard
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.registry import WorkerInfo, WorkerStatus

REGISTER_TIMEOUT_S = 10.0
# A worker's own traffic: a heartbeat every 2 s, and per session placed on it an `opened`, an
# `answer` and an `ended`; a burst of sessions starting at once stays far below these.
MESSAGE_RATE_PER_S = 200.0
MESSAGE_BURST = 400


class WorkerSocket:
    def __init__(
        self, ws: web.WebSocketResponse, ctx: SignalingContext, identity: Identity
    ) -> None:
        self.ws = ws
        self.ctx = ctx
        self.identity = identity
        self.info: WorkerInfo | None = None
        self.relay: WorkerRelay | None = None
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
                except Exception:  # a bug of ours: answered and logged; the socket stays open
                    await self.guard.internal_error(
                        frame=msg.type.name,
                        worker=self.info.worker_id if self.info is not None else None,
                    )
                if self.guard.exhausted:
                    await self.guard.close()
                    break
        finally:
            if self.info is not None and self.relay is not None:
                await self.ctx.channels.leave_worker(self.info.worker_id)
                if await self._still_mine():
                    await self.relay.lost("worker_disconnected")

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
        if await self._registered(message.worker_id) is not None:
            await self._refuse(f"worker id {message.worker_id!r} is already registered and alive")
            return False
        self.info = WorkerInfo.of(message, self.ctx.replica_id)
        self.relay = WorkerRelay(self.ctx, message.worker_id)
        await self.ctx.channels.on_worker(message.worker_id, self._to_socket)
        await self.relay.register(self.info)
        audit("audit.worker.registered", worker=message.worker_id, slots=message.slots,
              subject=self.identity.subject)  # fmt: skip
        await self.guard.send(encode_message(Registered(message.worker_id)))
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
            await self.relay.heartbeat(self.info, message.load)
        elif isinstance(message, Register):
            raise ProtocolError(ErrorCode.BAD_ORDER, "already registered")
        else:
            await self.relay.from_worker(message)

    async def _still_mine(self) -> bool:
        """Only the socket a worker registered through may unregister it."""
        assert self.info is not None
        status = await self._registered(self.info.worker_id)
        return status is not None and status.info.replica == self.info.replica

    async def _registered(self, worker_id: str) -> WorkerStatus | None:
        workers = await self.ctx.registry.workers()
        return next((w for w in workers if w.info.worker_id == worker_id), None)

    async def _to_socket(self, request: SessionRequest) -> None:
        await self.guard.send(encode_message(request))

    async def _refuse(self, reason: str) -> None:
        audit("audit.worker.refused", subject=self.identity.subject, reason=reason)
        await self.guard.send(encode_message(Error(ErrorCode.BAD_ORDER, reason)))
        await self.ws.close(code=1008, message=reason[:120].encode())
