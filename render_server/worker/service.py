"""The worker side of the worker protocol: signaling's requests → sessions of a LocalWorker.

The same service runs behind a WebSocket (`render-server worker`) and in process (`serve`'s
embedded worker); only how replies travel differs.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from render_server.logs import session_logger
from render_server.protocol.errors import ErrorCode
from render_server.protocol.viewers import (
    SESSION_ENDED,
    ViewerEnded,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewerRequest,
    ViewersEnd,
)
from render_server.protocol.worker import (
    CloseSession,
    DrainWorker,
    Heartbeat,
    OpenSession,
    Register,
    Registered,
    SessionHandoff,
    SessionIce,
    SessionOffer,
    SessionOpened,
    ToSignaling,
    ToWorker,
    WorkerAnswer,
    WorkerError,
    WorkerSessionEnded,
)
from render_server.stream.session import SessionNegotiationError, StreamSession
from render_server.worker.local import LocalWorker
from render_server.worker.serial import KeyedSerializer

log = logging.getLogger(__name__)
# A session's teardown is bounded piece by piece (the peer's close by PEER_CLOSE_S); this bounds
# the whole, so that one session stuck in it never holds up the worker's stop.
SESSION_CLOSE_S = 15.0

Send = Callable[[ToSignaling], Awaitable[None]]
# a drain asked for by signaling (`worker.drain`): its reason and deadline (None: the worker's)
DrainHandler = Callable[[str, float | None], object]


class SessionService(Protocol):
    """What the agent, the embedded worker and the drain need of a worker's sessions: served in
    this process (WorkerService) or in child processes (worker/pool.py's PoolService)."""

    worker: LocalWorker
    send: Send
    draining: bool
    on_drain: DrainHandler | None
    changed: asyncio.Event

    @property
    def sessions(self) -> Mapping[str, object]: ...
    @property
    def idle(self) -> bool: ...
    def submit(self, message: ToWorker) -> None: ...
    async def drain(self) -> None: ...
    async def cancel(self) -> None: ...
    def registration(self) -> Register: ...
    def heartbeat(self) -> Heartbeat: ...
    async def handoff(self, sid: str) -> None: ...
    async def handoffs(self) -> None: ...
    async def close_all(self, reason: str) -> None: ...


def new_instance() -> str:
    """A random nonce of this worker process (`Register.instance`)."""
    return secrets.token_urlsafe(12)


class WorkerService:
    def __init__(
        self,
        worker: LocalWorker,
        send: Send,
        labels: tuple[str, ...] = (),
        region: str | None = None,
        instance: str | None = None,
    ) -> None:
        self.worker = worker
        self.send = send
        self.labels = labels
        self.region = region
        self.instance = instance or new_instance()
        self.sessions: dict[str, StreamSession] = {}
        self.draining = False  # no new session; the ones here are handed over
        self.on_drain: DrainHandler | None = None
        self.changed = asyncio.Event()  # set whenever a session comes or goes
        self._opening: set[str] = set()
        # one session's messages in order, different sessions' at once
        self._serial = KeyedSerializer()

    @property
    def idle(self) -> bool:
        """No session here, none starting."""
        return not self.sessions and not self._opening

    def submit(self, message: ToWorker) -> None:
        """Handle `message` after the earlier ones for the same session."""
        key = "" if isinstance(message, Registered | DrainWorker) else message.session_id
        self._serial.submit(key, lambda: self.handle(message))

    async def drain(self) -> None:
        """Wait for every message submitted so far to be handled."""
        await self._serial.drain()

    async def cancel(self) -> None:
        """Abandon the messages still being handled (the process ends)."""
        await self._serial.cancel()

    def registration(self) -> Register:
        return Register(
            worker_id=self.worker.worker_id,
            slots=self.worker.slots,
            capabilities=self.worker.capabilities,
            labels=self.labels,
            region=self.region,
            instance=self.instance,
            session_ids=tuple(self.sessions),
            draining=self.draining,
        )

    def heartbeat(self) -> Heartbeat:
        load: dict[str, Any] = {"frames": sum(s.frames for s in self.sessions.values())}
        return Heartbeat(
            sessions=len(self.sessions),
            load=load,
            session_ids=tuple(self.sessions),
            draining=self.draining,
        )

    async def handoff(self, sid: str) -> None:
        """`session.handoff` of one session with its state, for signaling to move it."""
        session = self.sessions.get(sid)
        if session is None:
            return
        try:
            state = session.export_state()
        except Exception:  # a bug of ours: the session still moves, from the start
            session_logger(__name__, sid).exception("session.export_failed")
            state = {}
        await self.send(SessionHandoff(sid, state))

    async def handoffs(self) -> None:
        for sid in list(self.sessions):
            await self.handoff(sid)

    async def handle(self, message: ToWorker) -> None:
        if isinstance(message, OpenSession):
            await self._open(message)
        elif isinstance(message, DrainWorker):
            if self.on_drain is None:
                log.warning("worker.drain_unsupported", extra={"reason": message.reason})
            else:
                self.on_drain(message.reason, message.deadline_s)
        elif not isinstance(message, Registered):  # the agent takes that one itself
            session = self.sessions.get(message.session_id)
            if isinstance(message, ViewerRequest):
                await self._viewer(session, message)
                return
            if session is None:
                if isinstance(message, CloseSession):  # every close is answered, known or not
                    await self.send(WorkerSessionEnded(message.session_id, message.reason))
                else:
                    await self._error(
                        message.session_id, ErrorCode.UNKNOWN_SESSION, "no such session"
                    )
                return
            if isinstance(message, SessionOffer):
                await self._offer(session, message)
            elif isinstance(message, SessionIce):
                try:
                    await session.add_ice_candidate(message.as_candidate())
                except SessionNegotiationError as exc:
                    await self._error(message.session_id, ErrorCode.BAD_MESSAGE, str(exc))
            elif isinstance(message, CloseSession):
                await session.close(message.reason)

    async def _viewer(self, session: StreamSession | None, message: ViewerRequest) -> None:
        """A viewer's offer (answered `viewer.answer` or `viewer.ended`), candidate or leaving;
        for a session not here (it ended, it moved), `viewer.ended`."""
        if session is None:
            # a page that left needs no answer, nor do viewers of a session that is gone
            if not isinstance(message, ViewerLeave | ViewersEnd):
                sid, vid = message.session_id, message.viewer_id
                await self.send(ViewerEnded(sid, vid, SESSION_ENDED, "the session ended"))
            return
        viewers = session.viewers
        if isinstance(message, ViewerOffer):
            reply = await viewers.offer(message.viewer_id, message.name, message.sdp)
            await self.send(reply)
        elif isinstance(message, ViewerIce):
            await viewers.add_ice(message.viewer_id, message.as_candidate())
        elif isinstance(message, ViewersEnd):
            await viewers.end_all(message.code, message.message)
        else:
            await viewers.leave(message.viewer_id, message.reason)

    async def close_all(self, reason: str) -> None:
        async def close(session: StreamSession) -> None:
            try:
                async with asyncio.timeout(SESSION_CLOSE_S):
                    await session.close(reason)
            except TimeoutError:
                log.error("worker.session_close_stuck", extra={"session": session.session_id})

        await asyncio.gather(*(close(session) for session in list(self.sessions.values())))

    async def _open(self, message: OpenSession) -> None:
        sid = message.session_id
        if sid in self.sessions or sid in self._opening:
            # a repeated request (a browser resumed the session): already there, now in the
            # hands of the resuming token's role
            session = self.sessions.get(sid)
            if session is not None:
                session.set_role(message.role)
            await self.send(self._opened(sid))
            return
        if self.draining or len(self.sessions) + len(self._opening) >= self.worker.slots:
            text = "this worker is draining" if self.draining else "this worker has no free slot"
            await self._error(sid, ErrorCode.NO_CAPACITY, text)
            await self.send(WorkerSessionEnded(sid, ErrorCode.NO_CAPACITY))
            return
        self._opening.add(sid)
        try:
            session = await self.worker.open_session(
                sid, self._ended_callback(sid), role=message.role,
                ice_servers=message.ice_servers, state=message.state, name=message.name,
            )  # fmt: skip
        except Exception as exc:
            session_logger(__name__, sid).exception("session.open_failed")
            await self._error(sid, ErrorCode.WORKER_FAILED, f"the worker could not start: {exc}")
            await self.send(WorkerSessionEnded(sid, ErrorCode.WORKER_FAILED))
            return
        finally:
            self._opening.discard(sid)
            self.changed.set()
        self.sessions[sid] = session
        session.viewers.on_ended = self.send  # `viewer.ended` of a viewer it lets go
        await self.send(self._opened(sid))
        if self.draining:  # it started while the worker began to drain: it moves too
            await self.handoff(sid)

    def _opened(self, sid: str) -> SessionOpened:
        stream = self.worker.stream
        res = stream.resolution
        session = self.sessions.get(sid)
        connected = session is not None and session.connected
        # before its offer, a session's codec is the worker's first choice; the answer settles it
        codec = session.pipeline.codec if session is not None else self.worker.codecs[0]
        return SessionOpened(sid, res.width, res.height, stream.fps, codec, connected)

    async def _offer(self, session: StreamSession, message: SessionOffer) -> None:
        try:
            sdp = await session.accept_offer(message.sdp)
        except SessionNegotiationError as exc:
            await self._error(session.session_id, ErrorCode.BAD_OFFER, str(exc))
            await session.close("bad_offer")
            return
        await self.send(WorkerAnswer(session.session_id, sdp))

    def _ended_callback(self, sid: str) -> Callable[[str], Awaitable[None]]:
        async def ended(reason: str) -> None:
            self.sessions.pop(sid, None)
            self.changed.set()
            await self.send(WorkerSessionEnded(sid, reason))

        return ended

    async def _error(self, sid: str, code: str, text: str) -> None:
        await self.send(WorkerError(sid, code, text))
