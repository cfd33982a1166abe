"""One browser's signaling socket: parse, check, and hand the messages to its session.

The session's role is the socket's token's, on a start and on a resume alike; its caps count
the token's subject and the socket's client address (`SessionTable.create`). A socket either
holds a session (start, resume; its controller may share it) or watches one (`session.watch`
with a share link's token, `viewer.py`); a share link's token does nothing but watch."""

from __future__ import annotations

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from render_server.protocol.bus import Resumed
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import (
    ClientMessage,
    IceCandidate,
    Offer,
    ServerMessage,
    SessionEnd,
    SessionResume,
    SessionShare,
    SessionShared,
    SessionStart,
    SessionUnshare,
    SessionUnshared,
    SessionWatch,
    parse_client_message,
)
from render_server.protocol.viewers import REVOKED, ViewersEnd
from render_server.protocol.wire import encode_message
from render_server.signaling.access import refusal
from render_server.signaling.audit import audit, audit_refusal
from render_server.signaling.auth import AuthError, Identity
from render_server.signaling.faults import is_outage
from render_server.signaling.message_guard import MessageGuard
from render_server.signaling.session import ENDED, SessionHandle
from render_server.signaling.session_table import SessionTable
from render_server.signaling.share_links import DEFAULT_TTL_S, REWATCH_TTL_S
from render_server.signaling.viewer import ViewerHandle

MESSAGE_RATE_PER_S = 20.0
MESSAGE_BURST = 60  # a burst of trickled ICE candidates


class BrowserConnection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        sessions: SessionTable,
        identity: Identity,
        address: str = "unknown",
    ) -> None:
        self.ws = ws
        self.sessions = sessions
        self.ctx = sessions.ctx
        self.identity = identity
        self.address = address  # edge.client_address of the upgrade request
        self.handle: SessionHandle | None = None
        self.viewer: ViewerHandle | None = None  # what this socket watches, if it does
        self.guard = MessageGuard(
            ws, self.ctx.metrics, identity.subject, channel="signaling",
            rate_per_s=MESSAGE_RATE_PER_S, burst=MESSAGE_BURST,
        )  # fmt: skip

    async def run(self) -> None:
        try:
            async for msg in self.ws:
                message: ClientMessage | None = None
                try:
                    message = self._read(msg)
                    if message is not None:
                        await self._dispatch(message)
                        self.ctx.metrics.messages.labels(message.type).inc()
                except ProtocolError as exc:
                    await self.guard.reject(exc)
                except Exception as exc:
                    if is_outage(exc):  # Redis away: the media goes on; the page may retry
                        self.ctx.state_health.failed(exc)
                        await self.guard.unavailable(exc)
                        continue
                    # a bug of ours: answered and logged; the socket stays open
                    await self.guard.internal_error(
                        frame=msg.type.name,
                        type=message.type if message is not None else None,
                        session=self.handle.session_id if self.handle is not None else None,
                    )
                if self.guard.exhausted:
                    await self.guard.close()
                    break
        finally:
            if self.handle is not None and self.handle.state != ENDED:
                self.handle.detach(self._send)
            if self.viewer is not None:
                await self.viewer.leave("left")

    def _read(self, msg: WSMessage) -> ClientMessage | None:
        """The message of a text frame (within the rate), or ProtocolError; None for a frame
        that carries none."""
        if msg.type == WSMsgType.TEXT:
            self.guard.admit()
            return parse_client_message(msg.data)
        if msg.type == WSMsgType.BINARY:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "send JSON text frames")
        if msg.type == WSMsgType.ERROR:
            # aiohttp has closed the socket: over the transport limit (1009) or, as RFC 6455
            # wants, a text frame that is not UTF-8 (1007)
            too_big = getattr(msg.data, "code", None) == WSCloseCode.MESSAGE_TOO_BIG
            self.ctx.metrics.rejected.labels(
                ErrorCode.TOO_LARGE if too_big else ErrorCode.BAD_JSON
            ).inc()
            audit("audit.socket.closed", subject=self.identity.subject,
                  reason=str(msg.data)[:200])  # fmt: skip
        return None

    async def _dispatch(self, message: ClientMessage) -> None:
        if isinstance(message, SessionWatch):
            await self._watch(message)
            return
        if self.identity.session is not None and isinstance(
            message, SessionStart | SessionResume | SessionShare | SessionUnshare
        ):
            raise ProtocolError(ErrorCode.FORBIDDEN, "a share link's token can only watch")
        if self.viewer is not None and self.viewer.live:
            await self._as_viewer(self.viewer, message)
            return
        if self.viewer is not None and isinstance(message, IceCandidate):
            return  # candidates trickling in after the watch ended: dropped quietly
        handle = self.handle if self.handle is not None and self.handle.state != ENDED else None
        if handle is not None and not handle.attached(self._send):
            # another socket resumed the session (perhaps with another role): this one may
            # start or resume a session, but no longer speaks for that one
            self.handle = handle = None
            if not isinstance(message, SessionStart | SessionResume):
                raise ProtocolError(ErrorCode.BAD_ORDER, "the session was resumed elsewhere")
        if isinstance(message, SessionStart):
            if handle is not None:
                raise ProtocolError(ErrorCode.BAD_ORDER, "a session is already running here")
            await self._start(message)
        elif isinstance(message, SessionResume):
            if handle is not None:
                raise ProtocolError(ErrorCode.BAD_ORDER, "a session is already running here")
            await self._resume(message)
        elif handle is None:
            if isinstance(message, IceCandidate) and self.handle is not None:
                # the browser's candidates trickle in after its session ended (a refused offer,
                # a failure): expected, and dropped without an answer or a log line each
                return
            raise ProtocolError(ErrorCode.BAD_ORDER, "send session.start first")
        elif isinstance(message, Offer):
            await handle.offer(message.sdp)
        elif isinstance(message, IceCandidate):
            await handle.ice(message)
        elif isinstance(message, SessionEnd):
            await handle.end()
        elif isinstance(message, SessionShare):
            await self._share(handle, message)
        elif isinstance(message, SessionUnshare):
            await self._unshare(handle)

    async def _start(self, message: SessionStart) -> None:
        self.handle, _ = await self.sessions.create(
            self.identity, self.address, message.requirements
        )  # over a cap: ProtocolError too_many_sessions, answered; the socket stays open
        self.handle.attach(self._send)
        await self.handle.start()

    async def _resume(self, message: SessionResume) -> None:
        sid = message.session_id
        record = await self.ctx.store.get(sid)
        if record is None:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "no such session (it may have ended)")
        # the owner's check (an admin opens no socket: BROWSER_ROLES), and the resume secret
        refused = refusal(self.identity, record, "read")
        if refused is not None or not record.token_matches(message.resume_token):
            audit_refusal("audit.resume.refused", subject=self.identity.subject, session=sid)
            raise ProtocolError(ErrorCode.FORBIDDEN, "that session is not yours")
        # the session takes this token's role: a viewer's token resumes it as a viewer's
        bumped = await self.ctx.store.bump(sid, self.identity.role)
        if bumped is None:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "no such session (it just ended)")
        audit("audit.session.resume", session=sid, subject=self.identity.subject,
              role=bumped.role, address=self.address)  # fmt: skip
        handle = self.sessions.adopt(bumped)
        # the replica that held the session before lets go of it
        await self.ctx.channels.to_session(sid, Resumed(bumped.generation))
        self.handle = handle
        handle.attach(self._send)
        await handle.take_over()

    async def _as_viewer(self, viewer: ViewerHandle, message: ClientMessage) -> None:
        """A message of a socket that watches a session."""
        if isinstance(message, Offer):
            await viewer.offer(message.sdp)
        elif isinstance(message, IceCandidate):
            await viewer.ice(message)
        elif isinstance(message, SessionEnd):
            await viewer.leave()
        elif isinstance(message, SessionStart | SessionResume):
            raise ProtocolError(ErrorCode.BAD_ORDER, "this socket watches a session: end it first")
        else:
            raise ProtocolError(ErrorCode.BAD_ORDER, "a viewer cannot share the session")

    @staticmethod
    def _check_owner(handle: SessionHandle) -> None:
        if handle.record.role != "controller":
            raise ProtocolError(ErrorCode.FORBIDDEN, "only the session's controller may share it")

    async def _share(self, handle: SessionHandle, message: SessionShare) -> None:
        self._check_owner(handle)
        link = self.ctx.share_links.mint(
            handle.session_id, message.ttl_s or DEFAULT_TTL_S, message.page_url,
            handle.record.share_epoch,
        )  # fmt: skip
        self.ctx.metrics.shares.inc()
        audit("audit.session.share", session=handle.session_id, subject=self.identity.subject,
              expires_at=link.expires_at)  # fmt: skip
        await self._send(
            SessionShared(handle.session_id, link.token, link.expires_at, link.url, link.qr_svg)
        )

    async def _unshare(self, handle: SessionHandle) -> None:
        """Withdraw every link to the session and end its viewers' streams."""
        self._check_owner(handle)
        record = await self.ctx.store.stop_sharing(handle.session_id)
        if record is None:
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "the session has ended")
        handle.record = record  # renewals store the holder's copy again after an outage
        if handle.worker_id is not None:
            end = ViewersEnd(handle.session_id, REVOKED, "the owner stopped sharing")
            await self.ctx.channels.to_worker(handle.worker_id, end)
        audit("audit.session.unshare", session=handle.session_id, epoch=record.share_epoch)
        await self._send(SessionUnshared(handle.session_id))

    async def _watch(self, message: SessionWatch) -> None:
        """Watch the session a share link names; the watch this socket had ends first."""
        if (
            self.handle is not None
            and self.handle.state != ENDED
            and self.handle.attached(self._send)
        ):
            raise ProtocolError(ErrorCode.BAD_ORDER, "this socket holds a session: end it first")
        outcomes = self.ctx.metrics.watches
        try:
            link = self.ctx.share_links.read(message.token)
        except AuthError as exc:
            outcomes.labels("unauthorized").inc()
            audit_refusal("audit.watch.refused", subject=self.identity.subject,
                          reason=exc.message)  # fmt: skip
            raise ProtocolError(ErrorCode.UNAUTHORIZED, exc.message) from None
        sid = link.session_id
        if self.identity.session not in (None, sid):
            outcomes.labels("forbidden").inc()
            raise ProtocolError(ErrorCode.FORBIDDEN, "this socket's token is for another session")
        record = await self.ctx.store.get(sid)
        if record is None:
            outcomes.labels("unknown_session").inc()
            raise ProtocolError(ErrorCode.UNKNOWN_SESSION, "the shared session has ended")
        if link.epoch != record.share_epoch:
            outcomes.labels("revoked").inc()
            raise ProtocolError(ErrorCode.UNAUTHORIZED, "the owner stopped sharing this session")
        if self.viewer is not None:
            await self.viewer.leave("rewatch")
        outcomes.labels("watching").inc()
        audit("audit.session.watch", session=sid, subject=self.identity.subject,
              address=self.address)  # fmt: skip
        self.viewer = ViewerHandle(self.ctx, sid, message.name or "viewer", self._send)
        rewatch = self.ctx.share_links.mint(sid, REWATCH_TTL_S, epoch=record.share_epoch)
        await self.viewer.start(rewatch.token)

    async def _send(self, message: ServerMessage) -> None:
        await self.guard.send(encode_message(message))
