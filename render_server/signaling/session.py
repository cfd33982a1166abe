"""One session as a signaling replica sees it: claim or queue, open on the worker, relay, move.

A `SessionHandle` lives on the replica that holds the browser's socket and owns the session's
channel subscription (the worker's replies, the registry's news); `SessionTable` renews its
leases. The browser may drop and come back (`session.resume`, here or on another replica) within
the grace period: a queued session meanwhile keeps its place but is skipped (parked). An attached
browser offers within `offer_timeout_s` or the slot is freed. A close is acknowledged by the
worker, or sent again, then the slot freed without it; an open is sent again while unanswered
(`resend`). A session whose worker drains moves, with
the state the worker handed over: `session.moving`, then `session.started` naming the new worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from render_server.logs import session_logger
from render_server.protocol.bus import Assigned, EndRequested, Resumed, SessionNews, WorkerLost
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import unservable_reason
from render_server.protocol.signaling import (
    Answer,
    Error,
    IceCandidate,
    IceServer,
    Queued,
    ServerMessage,
    SessionEnded,
    SessionInterrupted,
    SessionMoving,
    SessionStarted,
)
from render_server.protocol.worker import (
    CloseSession,
    OpenSession,
    SessionHandoff,
    SessionIce,
    SessionOffer,
    SessionOpened,
    WorkerAnswer,
    WorkerError,
    WorkerRequest,
    WorkerSessionEnded,
)
from render_server.signaling.audit import audit
from render_server.signaling.context import SignalingContext
from render_server.signaling.relay import REGISTRY_LEASE_S, WorkerRelay, publish_assignments
from render_server.signaling.resend import sleep_resending
from render_server.signaling.share_links import owner_name
from render_server.signaling.state.registry import MOVE_AHEAD_US, Claim, Ticket
from render_server.signaling.state.session_store import SessionRecord
from render_server.signaling.timers import Timers
from render_server.signaling.turn import ice_servers_for

log = logging.getLogger(__name__)

Send = Callable[[ServerMessage], Awaitable[None]]

QUEUED, OPENING, OPEN, ENDED = "queued", "opening", "open", "ended"  # a handle's states

CLOSE_ACK_S = 5.0  # a close unanswered this long is sent again, then the slot freed without it


class Holder(Protocol):  # what a handle needs of the table that holds it (session_table.py)
    ctx: SignalingContext

    def hold(self, handle: SessionHandle) -> None: ...

    def let_go(self, handle: SessionHandle) -> bool: ...


class SessionHandle:
    def __init__(
        self, table: Holder, record: SessionRecord, resume_token: str | None = None
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
        self.queued_at: int | None = None  # the queue's score of this session (its arrival)
        self.handed_state: dict[str, Any] = {}  # what a draining worker handed over
        self._move_to: str | None = None  # the worker the session is moving to
        self._move_waits = False  # a move is queued: no other worker was free
        self._offer_due = True  # False when the worker says the media flows (a resume)
        self._resume_token = resume_token  # told to the browser once, on the first start
        self._send: Send | None = None
        self._timers = Timers(self.log)
        self._released = False  # let go of: news and timers change nothing any more
        self.end_reason: str | None = None
        self._closing: str | None = None  # the reason the worker was asked to close it with
        self._ice_servers: list[IceServer] = []

    @property
    def live(self) -> bool:  # neither ended nor let go of
        return self.state != ENDED and not self._released

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
        registry = self.ctx.registry
        # a parked queue place comes back where it was (and may be served at once)
        await publish_assignments(self.ctx, await registry.unpark(self.session_id))
        worker = await registry.worker_of(self.session_id)
        if worker is not None:
            await registry.renew(self.ctx.replica_id, [self.session_id], REGISTRY_LEASE_S)
            await self._open_on(worker)  # it answers at once, saying if the media flows
        else:  # asked again, a queued session keeps its place and score (owned here now)
            await self._place()

    def attach(self, send: Send) -> None:
        self._timers.cancel("grace")
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
        self._timers.cancel("offer")  # the grace period bounds a session nobody is attached to
        if not self.live:
            return
        if self.state == QUEUED:  # keeps its place, but the next in line is served meanwhile
            self._timers.start("park", self.ctx.registry.park(self.session_id))
        self._timers.start("grace", self._grace())

    async def offer(self, sdp: str) -> None:
        if self.state != OPEN:
            raise ProtocolError(ErrorCode.BAD_ORDER, "the session is not ready for an offer yet")
        self._timers.cancel("offer")
        self.offered = True
        await self._to_worker(SessionOffer(self.session_id, sdp))

    async def ice(self, candidate: IceCandidate) -> None:
        if self.state != OPEN or not self.offered:
            raise ProtocolError(ErrorCode.BAD_ORDER, "send the offer before ICE candidates")
        await self._to_worker(SessionIce.of(self.session_id, candidate))

    async def end(self, reason: str = "client_ended") -> None:
        """End the session, or leave the queue."""
        if self.state == QUEUED:
            withdrawn = await self.ctx.registry.withdraw(self.session_id)
            for claim in [withdrawn.released, *withdrawn.also_released]:
                if claim is not None:  # assigned as it left the queue: freed, the worker told
                    await self._close_on(claim.worker_id, reason)
            await publish_assignments(self.ctx, withdrawn.served)
            if withdrawn.was_waiting or withdrawn.released is not None:
                await self.ctx.channels.queue_changed()
            await self._finish("cancelled" if reason == "client_ended" else reason)
        elif self.state in (OPENING, OPEN):
            # the worker replies session.ended; the relay frees the slot then
            self._closing = reason
            await self._to_worker(CloseSession(self.session_id, reason))
            self._timers.start("close", self._close_ack(reason))

    async def check_queued(self) -> None:
        """After an outage of the shared state: a queued session the registry lost is queued
        again at its old place (a slot may serve it at once)."""
        if self.ctx.state_health.stable_for() > 2 * REGISTRY_LEASE_S or self._send is None:
            return
        registry = self.ctx.registry
        if await registry.position(self.session_id) is not None:
            return
        if await registry.worker_of(self.session_id) is not None:
            return  # assigned: its news is on the way
        self.log.info("session.requeued")
        await self._placed(await self._request(queued_at=self.queued_at))

    # -- placement --------------------------------------------------------------------------

    async def _request(self, refuse: bool = False, queued_at: int | None = None) -> Ticket:
        return await self.ctx.registry.request(
            self.session_id, self.record.requirements, refuse, owner=self.ctx.replica_id,
            lease_s=REGISTRY_LEASE_S, queued_at=queued_at,
        )  # fmt: skip

    async def _place(self, refuse_unservable: bool = False) -> None:
        await self._placed(await self._request(refuse_unservable))

    async def _placed(self, ticket: Ticket) -> None:
        if ticket.unservable:
            self.log.info("session.no_capacity", extra=self.record.requirements.as_dict())
            workers: list[Any] = []
            with contextlib.suppress(Exception):  # the registry away: a vaguer reason, still true
                workers = [w.info.capabilities for w in await self.ctx.registry.workers()]
            reason = unservable_reason(self.record.requirements, workers)
            await self._tell(Error(ErrorCode.NO_CAPACITY, reason))
            await self._finish(ErrorCode.NO_CAPACITY)
        elif ticket.claim is not None:
            self.ctx.metrics.claims.inc()
            await self._open_on(ticket.claim.worker_id)
        else:
            self.state, self.position = QUEUED, ticket.position
            self.queued_at = ticket.queued_at
            self.ctx.metrics.queued.inc()
            token, self._resume_token = self._resume_token, None  # told once
            await self._tell(Queued(self.session_id, ticket.position or 0, token))

    async def _open_on(self, worker_id: str) -> None:
        """Open the session on `worker_id`; during a move the old worker streams meanwhile."""
        if self._move_to is None:
            self.state, self.worker_id = OPENING, worker_id
            self.offered, self.position = False, None
        config = self.ctx.config
        self._ice_servers = ice_servers_for(
            self.session_id, config.ice_servers, config.turn_urls, config.turn_secret,
            config.turn_ttl_s,
        )  # fmt: skip
        state, name = self.handed_state, owner_name(self.record.owner)
        request = OpenSession(self.session_id, self.record.role, self._ice_servers, state, name)
        self._timers.start("open", self._open_deadline(worker_id, request))
        await self.ctx.channels.to_worker(worker_id, request)

    async def _open_deadline(self, worker_id: str, request: OpenSession) -> None:
        await sleep_resending(  # sent again while unanswered, but not in a move (streams on)
            self.ctx.config.open_timeout_s,
            lambda: self.state == OPENING and self.worker_id == worker_id and not self._move_to,
            lambda: self.ctx.channels.to_worker(worker_id, request),
            self.log, "session.open_resent",
        )  # fmt: skip
        moving = self._move_to == worker_id
        if not moving and not (self.state == OPENING and self.worker_id == worker_id):
            return
        self.log.warning("session.open_timeout", extra={"worker": worker_id, "moving": moving})
        await self.ctx.channels.to_worker(worker_id, CloseSession(self.session_id, "open_timeout"))
        await self._tell(Error(ErrorCode.WORKER_FAILED, "the worker did not open the session"))
        if moving and self.worker_id is not None:  # the old worker's slot is freed too
            await self.ctx.registry.release(Claim(self.worker_id, self.session_id))
            await self._close_on(self.worker_id, "open_timeout")
        # as if the worker had ended it: the slot is freed and the queue served
        await WorkerRelay(self.ctx, worker_id).session_ended(self.session_id, "worker_failed")

    # -- moving (the worker drains) -----------------------------------------------------------

    async def _handoff(self, handoff: SessionHandoff) -> None:
        self.handed_state = handoff.state
        if self.state != OPEN or self._move_to is not None or self._move_waits:
            return  # a repeated handoff: the move is under way
        assert self.worker_id is not None
        ticket = await self.ctx.registry.move(
            self.session_id, self.worker_id, owner=self.ctx.replica_id, lease_s=REGISTRY_LEASE_S
        )
        if ticket.claim is not None:
            await self._move(ticket.claim.worker_id)
        elif ticket.position is not None:
            self._move_waits = True  # streams on meanwhile; `assigned` comes when a slot frees
            self.log.info("session.move_waits", extra={"position": ticket.position})

    async def _move(self, worker_id: str) -> None:
        self._move_to, self._move_waits = worker_id, False
        self.log.info("session.moving", extra={"from": self.worker_id, "to": worker_id})
        await self._tell(SessionMoving(self.session_id, "worker_draining"))
        await self._open_on(worker_id)

    async def _moved(self, opened: SessionOpened) -> None:
        old, new = self.worker_id, self._move_to
        assert old is not None and new is not None
        self._move_to, self.worker_id, self.offered = None, new, False
        self.ctx.metrics.sessions_moved.inc()
        await self._opened(opened)
        # the browser offers to the new worker now; the old one lets go (its slot is freed
        # when it says so; its `session.ended` is not this session's end)
        await self._close_on(old, "moved")

    # -- news on the session's channel -------------------------------------------------------

    async def _on_channel(self, news: SessionNews) -> None:
        if self._released:
            return
        if isinstance(news, Assigned):
            if self.state == QUEUED:
                await self._open_on(news.worker_id)
            elif self.state == OPEN and self._move_waits:
                await self._move(news.worker_id)
        elif isinstance(news, SessionOpened):
            if self._move_to is not None:
                await self._moved(news)
            elif self.state == OPENING:
                await self._opened(news)
        elif isinstance(news, WorkerAnswer):
            if self.state == OPEN:
                await self._tell(Answer(news.sdp))
        elif isinstance(news, WorkerError):
            await self._tell(Error(news.code, news.message))
        elif isinstance(news, WorkerSessionEnded):
            await self._finish(news.reason)
        elif isinstance(news, SessionHandoff):
            await self._handoff(news)
        elif isinstance(news, WorkerLost):
            if self.state in (OPENING, OPEN):
                await self._worker_lost(news.reason)
        elif isinstance(news, Resumed):
            if news.generation != self.record.generation:
                await self._let_go()  # another socket took the session over
        elif isinstance(news, EndRequested):
            await self.end(news.reason)

    async def _opened(self, opened: SessionOpened) -> None:
        self._timers.cancel("open")
        self.state = OPEN
        # a page whose socket dropped while its media flowed on need not offer again; a page
        # that reloaded has no media and must
        self._offer_due = not opened.connected
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
        self._timers.cancel("offer")
        if self.state == OPEN and self._send is not None and self._offer_due:
            self._timers.start("offer", self._offer_deadline())

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
        self._timers.cancel("open")
        self._move_to, self._move_waits = None, False
        await self._tell(SessionInterrupted(self.session_id, reason))
        self.worker_id = None
        # on another worker (with what was handed over), or first in the queue: a designer
        # who was streaming does not wait behind those who have not started yet
        ahead = int(time.time() * 1e6) - MOVE_AHEAD_US
        await self._placed(await self._request(queued_at=ahead))

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

    async def _close_ack(self, reason: str) -> None:
        """The worker answers a close with `session.ended`; a lost answer (the bus delivers at
        most once, a worker's socket may drop) must not keep the slot for ever."""
        await asyncio.sleep(CLOSE_ACK_S)
        worker = self.worker_id
        if not self.live or worker is None:
            return
        self.log.warning("session.close_unanswered", extra={"worker": worker})
        await self._to_worker(CloseSession(self.session_id, reason))
        await asyncio.sleep(CLOSE_ACK_S)
        if self.live and self.worker_id == worker:
            await WorkerRelay(self.ctx, worker).session_ended(self.session_id, reason)

    async def _close_on(self, worker_id: str, reason: str) -> None:
        await self.ctx.channels.to_worker(worker_id, CloseSession(self.session_id, reason))

    async def _finish(self, reason: str) -> None:
        if self.state == ENDED:
            return
        self.state, self.end_reason = ENDED, reason
        self._timers.cancel_all()
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
        self._released = True
        self._timers.cancel_all()  # another replica may serve it now: its timers end here
        if self.table.let_go(self):
            await self.ctx.channels.leave_session(self.session_id)
        self._send = None

    # -- plumbing ----------------------------------------------------------------------------

    async def _subscribe(self) -> None:
        self.table.hold(self)
        await self.ctx.channels.on_session(self.session_id, self._on_channel)

    async def _to_worker(self, request: WorkerRequest) -> None:
        assert self.worker_id is not None
        await self.ctx.channels.to_worker(self.worker_id, request)

    async def _tell(self, message: ServerMessage) -> None:
        if self._send is not None:
            await self._send(message)
