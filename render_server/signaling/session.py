"""One session as a signaling replica sees it: claim or queue, open on the worker, relay.

A `SessionHandle` lives on the replica that holds the browser's socket (or that created the
session over REST) and owns the session's channel subscription; the replica's `SessionTable`
holds its handles and renews their records' leases in the store. The browser's socket attaches
to a handle and may drop and come back (`session.resume`, on this replica or another one) within
the grace period; the worker's replies and the registry's news arrive on the session's channel.

The rules a session lives by: a subject and an address hold at most their caps of sessions
(`SessionTable.create`); requirements no registered worker meets are refused at once; an attached
browser offers within `offer_timeout_s` of the session opening, or the slot is freed; the role is
the one of the token last presented (a resume with a viewer token makes a viewer).
"""

from __future__ import annotations

import asyncio
import logging
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
from render_server.signaling.audit import audit, audit_refusal
from render_server.signaling.auth import Identity
from render_server.signaling.context import SignalingContext
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.state.session_store import (
    SessionCaps,
    SessionRecord,
    hash_token,
    new_resume_token,
)
from render_server.signaling.turn import ice_servers_for

log = logging.getLogger(__name__)

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
        self, identity: Identity, address: str, requirements: Requirements
    ) -> tuple[SessionHandle, str]:
        """A new session's record, stored and counted, with its handle (not started yet) and
        its resume token (the store keeps only the token's hash); ProtocolError
        `too_many_sessions` when the caller's subject or address is at its cap."""
        token = new_resume_token()
        record = SessionRecord(
            uuid.uuid4().hex, identity.subject, identity.role, hash_token(token), requirements,
            address=address,
        )  # fmt: skip
        config = self.ctx.config
        # anonymous callers all share one subject: only their addresses tell them apart
        per_subject = 0 if identity.anonymous else config.max_sessions_per_subject
        refused = await self.ctx.store.admit(
            record, SessionCaps(per_subject, config.max_sessions_per_address)
        )
        if refused is not None:
            audit_refusal("audit.session.too_many", subject=identity.subject, address=address,
                          cap=refused.cap, held=refused.held, limit=refused.limit)  # fmt: skip
            raise ProtocolError(
                ErrorCode.TOO_MANY_SESSIONS,
                f"this {refused.cap} holds {refused.held} sessions (queue places included), "
                f"the most allowed is {refused.limit}: end one first",
            )
        return SessionHandle(self, record, resume_token=token), token

    def adopt(self, record: SessionRecord) -> SessionHandle:
        """The handle of a session being resumed: this replica's, if it holds it already."""
        handle = self._held.get(record.session_id)
        if handle is None:
            return SessionHandle(self, record)
        handle.record = record  # the new generation, with the resuming token's role
        handle.log = session_logger(__name__, record.session_id, role=record.role)
        return handle

    async def keep_alive(self) -> None:
        """Renew the leases of the sessions held here, for as long as the replica runs: a
        replica that dies stops renewing, and its sessions stop counting within a lease."""
        while True:
            await asyncio.sleep(self.ctx.store.lease_s / 4)
            try:
                await self.ctx.store.renew(list(self._held))
            except Exception:
                log.exception("sessions.renew_failed")

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
        self._offer_timer: asyncio.Task[None] | None = None
        self.end_reason: str | None = None
        self._closing: str | None = None  # the reason the worker was asked to close it with
        self._ice_servers: list[IceServer] = []

    # -- entry points -----------------------------------------------------------------------

    async def start(self) -> None:
        """A new session: subscribe its channel, then claim a slot or join the queue; or end
        it at once (`no_capacity`) when no registered worker could ever serve it."""
        try:
            await self._subscribe()
            audit("audit.session.start", session=self.session_id, owner=self.record.owner,
                  role=self.record.role, address=self.record.address)  # fmt: skip
            self.ctx.metrics.sessions_started.inc()
            await self._place(refuse_unservable=True)
        except BaseException:
            # neither held (its lease renewed for ever) nor counted against its owner
            await self._let_go()
            await self.ctx.store.delete(self.session_id)
            raise

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
        _cancel(self._grace_timer)
        self._grace_timer = None
        self._send = send
        self._arm_offer_deadline()  # a socket that comes back must offer again

    def attached(self, send: Send) -> bool:
        """Whether `send`'s socket holds the session (a resume elsewhere takes it away)."""
        return self._send is not None and self._send == send

    def detach(self, send: Send | None = None) -> None:
        """The browser's socket (`send`'s, if given) is gone: end the session unless it comes
        back in time. A socket that another one has taken the session from changes nothing."""
        if send is not None and send != self._send:
            return
        self._send = None
        _cancel(self._offer_timer)  # the grace period bounds a session nobody is attached to
        if self.state == ENDED:
            return
        self._grace_timer = asyncio.get_running_loop().create_task(self._grace())

    async def offer(self, sdp: str) -> None:
        if self.state != OPEN:
            raise ProtocolError(ErrorCode.BAD_ORDER, "the session is not ready for an offer yet")
        _cancel(self._offer_timer)
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
            self._closing = reason
            await self._to_worker(CloseSession(self.session_id, reason))

    # -- placement --------------------------------------------------------------------------

    async def _place(self, refuse_unservable: bool = False) -> None:
        ticket = await self.ctx.registry.request(
            self.session_id, self.record.requirements, refuse_unservable
        )
        if ticket.unservable:
            self.log.info("session.no_capacity", extra=self.record.requirements.as_dict())
            await self._tell(
                Error(ErrorCode.NO_CAPACITY, "no registered worker can meet the requirements")
            )
            await self._finish(ErrorCode.NO_CAPACITY)
        elif ticket.claim is not None:
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
        _cancel(self._open_timer)
        self.state = OPEN
        self._arm_offer_deadline()
        assert self.worker_id is not None
        await self._tell(
            SessionStarted(
                session_id=self.session_id, worker_id=self.worker_id, width=opened.width,
                height=opened.height, fps=opened.fps, codec=opened.codec, role=self.record.role,
                resume_token=self._resume_token, ice_servers=self._ice_servers,
            )
        )  # fmt: skip
        self._resume_token = None

    def _arm_offer_deadline(self) -> None:
        """An open session with a browser attached: its offer is due (again) from now."""
        _cancel(self._offer_timer)
        if self.state == OPEN and self._send is not None:
            self._offer_timer = asyncio.get_running_loop().create_task(self._offer_deadline())

    async def _offer_deadline(self) -> None:
        timeout = self.ctx.config.offer_timeout_s
        await asyncio.sleep(timeout)
        if self.state != OPEN or self._send is None:
            return
        self.log.warning("session.offer_timeout", extra={"worker": self.worker_id})
        audit("audit.session.offer_timeout", session=self.session_id, owner=self.record.owner)
        await self._tell(
            Error(ErrorCode.OFFER_TIMEOUT, f"no offer within {timeout:g} s: the slot is freed")
        )
        # the worker closes the session and says so; the relay frees the slot then
        await self.end(ErrorCode.OFFER_TIMEOUT)

    async def _worker_lost(self, reason: str) -> None:
        if self._closing is not None:
            # lost before it answered the close: the session ends as asked, it is not placed
            # again (it would hold a slot until the new worker's connect timeout)
            await self._finish(self._closing)
            return
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
        self.state, self.end_reason = ENDED, reason
        for timer in (self._open_timer, self._grace_timer, self._offer_timer):
            _cancel(timer)
        audit("audit.session.end", session=self.session_id, owner=self.record.owner, reason=reason)
        self.ctx.metrics.sessions_ended.labels(reason).inc()
        try:
            # forgotten (and no longer counted) before the browser hears of it: a browser told
            # `session.ended` may start another at once, even at its cap
            await self.ctx.store.delete(self.session_id)
        finally:
            await self._tell(SessionEnded(reason))
            await self._let_go()

    async def _let_go(self) -> None:
        if self.table.let_go(self):
            await self.ctx.channels.leave_session(self.session_id)
        _cancel(self._grace_timer)  # unless it is the grace period letting go
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


def _cancel(timer: asyncio.Task[None] | None) -> None:
    """Cancel a timer, unless it is the task running this (it is ending on its own)."""
    if timer is not None and timer is not asyncio.current_task():
        timer.cancel()
