"""The worker side of the worker protocol: signaling's requests → sessions of a LocalWorker.

The same service runs behind a WebSocket (`render-server worker`) and in process (`serve`'s
embedded worker); only how replies travel differs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from render_server.logs import session_logger
from render_server.protocol.errors import ErrorCode
from render_server.protocol.worker import (
    CloseSession,
    Heartbeat,
    OpenSession,
    Register,
    Registered,
    SessionIce,
    SessionOffer,
    SessionOpened,
    SessionReply,
    ToWorker,
    WorkerAnswer,
    WorkerError,
    WorkerSessionEnded,
)
from render_server.stream.session import SessionNegotiationError, StreamSession
from render_server.worker.local import LocalWorker
from render_server.worker.serial import KeyedSerializer

log = logging.getLogger(__name__)

Send = Callable[[SessionReply], Awaitable[None]]


class WorkerService:
    def __init__(
        self,
        worker: LocalWorker,
        send: Send,
        labels: tuple[str, ...] = (),
        region: str | None = None,
    ) -> None:
        self.worker = worker
        self.send = send
        self.labels = labels
        self.region = region
        self.sessions: dict[str, StreamSession] = {}
        self._opening: set[str] = set()
        # one session's messages in order, different sessions' at once
        self._serial = KeyedSerializer()

    def submit(self, message: ToWorker) -> None:
        """Handle `message` after the earlier ones for the same session."""
        key = "" if isinstance(message, Registered) else message.session_id
        self._serial.submit(key, lambda: self.handle(message))

    async def drain(self) -> None:
        """Wait for every message submitted so far to be handled."""
        await self._serial.drain()

    def registration(self) -> Register:
        return Register(
            worker_id=self.worker.worker_id,
            slots=self.worker.slots,
            capabilities=self.worker.capabilities,
            labels=self.labels,
            region=self.region,
        )

    def heartbeat(self) -> Heartbeat:
        load: dict[str, Any] = {"frames": sum(s.frames for s in self.sessions.values())}
        return Heartbeat(sessions=len(self.sessions), load=load)

    async def handle(self, message: ToWorker) -> None:
        if isinstance(message, OpenSession):
            await self._open(message)
        elif not isinstance(message, Registered):  # the agent takes that one itself
            session = self.sessions.get(message.session_id)
            if session is None:
                if not isinstance(message, CloseSession):
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

    async def close_all(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            await session.close(reason)

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
        if len(self.sessions) + len(self._opening) >= self.worker.slots:
            await self._error(sid, ErrorCode.NO_CAPACITY, "this worker has no free slot")
            await self.send(WorkerSessionEnded(sid, ErrorCode.NO_CAPACITY))
            return
        self._opening.add(sid)
        try:
            session = await self.worker.open_session(
                sid, self._ended_callback(sid), role=message.role, ice_servers=message.ice_servers
            )
        except Exception as exc:
            session_logger(__name__, sid).exception("session.open_failed")
            await self._error(sid, ErrorCode.WORKER_FAILED, f"the worker could not start: {exc}")
            await self.send(WorkerSessionEnded(sid, ErrorCode.WORKER_FAILED))
            return
        finally:
            self._opening.discard(sid)
        self.sessions[sid] = session
        await self.send(self._opened(sid))

    def _opened(self, sid: str) -> SessionOpened:
        stream = self.worker.stream
        res = stream.resolution
        return SessionOpened(sid, res.width, res.height, stream.fps, "H264")

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
            await self.send(WorkerSessionEnded(sid, reason))

        return ended

    async def _error(self, sid: str, code: str, text: str) -> None:
        await self.send(WorkerError(sid, code, text))
