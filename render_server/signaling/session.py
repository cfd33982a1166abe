"""One session as a signaling replica sees it: claim or queue, open on the worker, relay.

A `SessionHandle` lives on the replica that holds the browser's socket (or that created the
session over REST) and owns the session's channel subscription; the replica's `SessionTable`
holds its handles. The browser's socket attaches to a handle and may drop and come back
(`session.resume`, on this replica or another one) within the grace period; the worker's
replies and the registry's news arrive on the session's channel.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

from render_server.logs import session_logger
from render_server.protocol.bus import (
    Assigned,
    EndRequested,
    QueueChanged,
    Resumed,
    SessionNews,
    WorkerLost,
)
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import Requirements
from render_server.protocol.signaling import (
    Answer,
    Error,
    IceCandidate,
    IceServer,
    Queued,
    ServerMessage,
    SessionEnded,
    SessionInterrupted,
    SessionStarted,
)
from render_server.protocol.worker import (
    CloseSession,
    OpenSession,
    SessionIce,
    SessionOffer,
    SessionOpened,
    SessionRequest,
    WorkerAnswer,
    WorkerError,
    WorkerSessionEnded,
)
from render_server.signaling.audit import audit
from render_server.signaling.context import SignalingContext
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.session_store import SessionRecord, hash_token, new_resume_token
from render_server.signaling.turn import ice_servers_for

Send = Callable[[ServerMessage], Awaitable[None]]

# states
QUEUED, OPENING, OPEN, ENDED = "queued", "opening", "open", "ended"


class SessionTable:
    """The sessions this replica holds, by id: each one's handle, subscribed to its channel."""

    def __init__(self, ctx: SignalingContext) -> None:
        self.ctx = ctx
        self._held: dict[str, SessionHandle] = {}

    def get(self, session_id: str) -> SessionHandle | None:
        return self._held.get(session_id)

    async def create(
        self, owner: str, role: str, requirements: Requirements
    ) -> tuple[SessionHandle, str]:
        """A new session's record, stored, with its handle (not started yet) and its resume
        token: the store keeps only the token's hash."""
        token = new_resume_token()
        record = SessionRecord(uuid.uuid4().hex, owner, role, hash_token(token), requirements)
        await self.ctx.store.put(record)
        return SessionHandle(self, record, resume_token=token), token

    def adopt(self, record: SessionRecord) -> SessionHandle:
        """The handle of a session being resumed: this replica's, if it holds it already."""
        handle = self._held.get(record.session_id)
        if handle is None:
            return SessionHandle(self, record)
        handle.record = record
        return handle

    async def on_queue_changed(self, _: QueueChanged) -> None:
        """The queue moved: the queued sessions held here tell their browsers."""
        order = {sid: i + 1 for i, sid in enumerate(await self.ctx.registry.queue())}
        self.ctx.metrics.queue_length.set(len(order))
        for handle in list(self._held.values()):
            await handle.on_queue_changed(order)

    def hold(self, handle: SessionHandle) -> None:
        self._held[handle.session_id] = handle

    def let_go(self, handle: SessionHandle) -> bool:
        """Forget the handle; False if another one (or none) holds its session here."""
        if self._held.get(handle.session_id) is not handle:
            return False
        del self._held[handle.session_id]
        return True


class SessionHandle:
    def __init__(
        self, table: SessionTable, record: SessionRecord, resume_token: str | None = None
    ) -> None:
        self.table = table
        self.ctx = table.ctx
        self.record = record
        self.session_id = record.session_id
        self.log = session_logger(__name__, self.session_id, role=record.role)
        self.state = QUEUED
        self.worker_id: str | None = None
        self.offered = False
        self.position: int | None = None
        self._resume_token = resume_token  # told to the browser once, on the first start
        self._send: Send | None = None
        self._open_timer: asyncio.Task[None] | None = None
        self._grace_timer: asyncio.Task[None] | None = None
        self._ice_servers: list[IceServer] = []

    # -- entry points -----------------------------------------------------------------------

    async def start(self) -> None:
        """A new session: subscribe its channel, then claim a slot or join the queue."""
        await self._subscribe()
        audit("audit.session.start", session=self.session_id, owner=self.record.owner,
              role=self.record.role)  # fmt: skip
        self.ctx.metrics.sessions_started.inc()
        await self._place()

    async def take_over(self) -> None:
        """This replica now holds a session that was started elsewhere (a resume)."""
        await self._subscribe()
        worker = await self.ctx.registry.worker_of(self.session_id)
        position = await self.ctx.registry.position(self.session_id)
        if worker is not None:
            await self._open_on(worker)  # the worker answers at once: it has the session
        elif position is not None:
            self.state, self.position = QUEUED, position
            await self._tell(Queued(self.session_id, position))
        else:
            await self._place()

    def attach(self, send: Send) -> None:
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None
        self._send = send

    def detach(self) -> None:
        """The browser's socket is gone: end the session unless it comes back in time."""
        self._send = None
        if self.state == ENDED:
            return
        self._grace_timer = asyncio.get_running_loop().create_task(self._grace())

    async def offer(self, sdp: str) -> None:
        if self.state != OPEN:
            raise ProtocolError(ErrorCode.BAD_ORDER, "the session is not ready for an offer yet")
        self.offered = True
        await self._to_worker(SessionOffer(self.session_id, sdp))

    async def ice(self, candidate: IceCandidate) -> None:
        if self.state != OPEN or not self.offered:
            raise ProtocolError(ErrorCode.BAD_ORDER, "send the offer before ICE candidates")
        await self._to_worker(SessionIce.of(self.session_id, candidate))

    async def end(self, reason: str = "client_ended") -> None:
        """End the session, or leave the queue."""
        if self.state == QUEUED:
            if await self.ctx.registry.cancel(self.session_id):
                await self.ctx.channels.queue_changed()
            await self._finish("cancelled" if reason == "client_ended" else reason)
        elif self.state in (OPENING, OPEN):
            # the worker replies session.ended; the relay frees the slot then
            await self._to_worker(CloseSession(self.session_id, reason))

    # -- placement --------------------------------------------------------------------------

    async def _place(self) -> None:
        ticket = await self.ctx.registry.request(self.session_id, self.record.requirements)
        if ticket.claim is not None:
            self.ctx.metrics.claims.inc()
            await self._open_on(ticket.claim.worker_id)
        else:
            self.state, self.position = QUEUED, ticket.position
            self.ctx.metrics.queued.inc()
            await self._tell(Queued(self.session_id, ticket.position or 0))

    async def _open_on(self, worker_id: str) -> None:
        self.state, self.worker_id, self.offered, self.position = OPENING, worker_id, False, None
        config = self.ctx.config
        self._ice_servers = ice_servers_for(
            self.session_id, config.ice_servers, config.turn_urls, config.turn_secret,
            config.turn_ttl_s,
        )  # fmt: skip
        self._open_timer = asyncio.get_running_loop().create_task(self._open_deadline(worker_id))
        await self._to_worker(OpenSession(self.session_id, self.record.role, self._ice_servers))

    async def _open_deadline(self, worker_id: str) -> None:
        await asyncio.sleep(self.ctx.config.open_timeout_s)
        if self.state == OPENING and self.worker_id == worker_id:
            self.log.warning("session.open_timeout", extra={"worker": worker_id})
            await self._to_worker(CloseSession(self.session_id, "open_timeout"))
            await self._tell(Error(ErrorCode.WORKER_FAILED, "the worker did not open the session"))
            # as if the worker had ended it: the slot is freed and the queue served
            await WorkerRelay(self.ctx, worker_id).session_ended(self.session_id, "worker_failed")

    # -- news on the session's channel -------------------------------------------------------

    async def _on_channel(self, news: SessionNews) -> None:
        if isinstance(news, Assigned):
            if self.state == QUEUED:
                await self._open_on(news.worker_id)
        elif isinstance(news, SessionOpened):
            if self.state == OPENING:
                await self._opened(news)
        elif isinstance(news, WorkerAnswer):
            if self.state == OPEN:
                await self._tell(Answer(news.sdp))
        elif isinstance(news, WorkerError):
            await self._tell(Error(news.code, news.message))
        elif isinstance(news, WorkerSessionEnded):
            await self._finish(news.reason)
        elif isinstance(news, WorkerLost):
            if self.state in (OPENING, OPEN):
                await self._worker_lost(news.reason)
        elif isinstance(news, Resumed):
            if news.generation != self.record.generation:
                await self._let_go()  # another socket took the session over
        elif isinstance(news, EndRequested):
            await self.end(news.reason)

    async def _opened(self, opened: SessionOpened) -> None:
        if self._open_timer is not None:
            self._open_timer.cancel()
        self.state = OPEN
        assert self.worker_id is not None
        await self._tell(
            SessionStarted(
                session_id=self.session_id, worker_id=self.worker_id, width=opened.width,
                height=opened.height, fps=opened.fps, codec=opened.codec, role=self.record.role,
                resume_token=self._resume_token, ice_servers=self._ice_servers,
            )
        )  # fmt: skip
        self._resume_token = None

    async def _worker_lost(self, reason: str) -> None:
        self.log.warning("session.worker_lost", extra={"worker": self.worker_id})
        await self._tell(SessionInterrupted(self.session_id, reason))
        self.worker_id = None
        await self._place()  # on another worker, or in the queue

    async def on_queue_changed(self, order: dict[str, int]) -> None:
        """The queue moved: tell the browser its new place if it changed."""
        position = order.get(self.session_id)
        if self.state == QUEUED and position is not None and position != self.position:
            self.position = position
            await self._tell(Queued(self.session_id, position))

    # -- endings -----------------------------------------------------------------------------

    async def _grace(self) -> None:
        await asyncio.sleep(self.ctx.config.resume_grace_s)
        record = await self.ctx.store.get(self.session_id)
        if record is not None and record.generation != self.record.generation:
            await self._let_go()  # resumed elsewhere in the meantime
            return
        self.log.info("session.browser_left")
        await self.end("browser_left")  # a queued session finishes there at once

    async def _finish(self, reason: str) -> None:
        if self.state == ENDED:
            return
        self.state = ENDED
        for timer in (self._open_timer, self._grace_timer):
            if timer is not None and timer is not asyncio.current_task():
                timer.cancel()
        audit("audit.session.end", session=self.session_id, owner=self.record.owner, reason=reason)
        self.ctx.metrics.sessions_ended.labels(reason).inc()
        await self._tell(SessionEnded(reason))
        await self._let_go()
        await self.ctx.store.delete(self.session_id)

    async def _let_go(self) -> None:
        if self.table.let_go(self):
            await self.ctx.channels.leave_session(self.session_id)
        if self._grace_timer is not None and self._grace_timer is not asyncio.current_task():
            self._grace_timer.cancel()
        self._send = None

    # -- plumbing ----------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        self.table.hold(self)
        await self.ctx.channels.on_session(self.session_id, self._on_channel)

    async def _to_worker(self, request: SessionRequest) -> None:
        assert self.worker_id is not None
        await self.ctx.channels.to_worker(self.worker_id, request)

    async def _tell(self, message: ServerMessage) -> None:
        if self._send is not None:
            await self._send(message)
