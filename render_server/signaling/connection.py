"""One browser's signaling socket: a small state machine over the typed messages."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiohttp import WSMsgType, web

from ..config import ServerConfig
from ..logs import session_logger
from ..metrics import Metrics
from ..rate_limit import TokenBucket
from .messages import (
    Answer,
    ClientMessage,
    Error,
    ErrorCode,
    IceCandidate,
    IceServer,
    Offer,
    ProtocolError,
    ServerMessage,
    SessionEnd,
    SessionEnded,
    SessionStart,
    SessionStarted,
    encode_message,
    parse_client_message,
)
from .registry import Claim, Registry
from .workers import SessionNegotiationError, WorkerHandle, WorkerSession

log = logging.getLogger(__name__)

MESSAGE_RATE_PER_S = 20.0
MESSAGE_BURST = 60  # a burst of trickled ICE candidates
MAX_VIOLATIONS = 100  # rejected messages before the socket is closed


class SignalingConnection:
    def __init__(
        self,
        ws: web.WebSocketResponse,
        config: ServerConfig,
        registry: Registry,
        workers: dict[str, WorkerHandle],
        metrics: Metrics,
    ) -> None:
        self.ws = ws
        self.config = config
        self.registry = registry
        self.workers = workers
        self.metrics = metrics
        self.claim: Claim | None = None
        self.session: WorkerSession | None = None
        self.offered = False
        self.violations = 0
        self._bucket = TokenBucket(MESSAGE_RATE_PER_S, MESSAGE_BURST)
        self._lock = asyncio.Lock()  # one message at a time, in order

    async def run(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type == WSMsgType.TEXT:
                    await self._handle(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await self._reject(
                        ProtocolError(ErrorCode.BAD_MESSAGE, "send JSON text frames")
                    )
                elif msg.type == WSMsgType.ERROR:
                    # over the transport limit: aiohttp has already closed with 1009
                    self.metrics.rejected.labels(ErrorCode.TOO_LARGE).inc()
                    log.info("signaling.closed_on_error", extra={"error": str(msg.data)[:200]})
                if self.violations >= MAX_VIOLATIONS:
                    await self.ws.close(code=1008, message=b"too many rejected messages")
                    break
        finally:
            await self._end_session("browser_left")

    async def _handle(self, data: str) -> None:
        if not self._bucket.take(time.monotonic()):
            await self._reject(
                ProtocolError(ErrorCode.RATE_LIMITED, f"over {MESSAGE_RATE_PER_S:g} messages/s")
            )
            return
        try:
            message = parse_client_message(data)
        except ProtocolError as exc:
            await self._reject(exc)
            return
        async with self._lock:
            try:
                await self._dispatch(message)
                self.metrics.messages.labels(message.type).inc()
            except ProtocolError as exc:
                await self._reject(exc)
            except Exception:
                log.exception("signaling.internal_error", extra={"type": message.type})
                await self._reject(ProtocolError(ErrorCode.INTERNAL, "internal server error"))

    async def _dispatch(self, message: ClientMessage) -> None:
        if isinstance(message, SessionStart):
            await self._start()
        elif isinstance(message, Offer):
            await self._offer(message)
        elif isinstance(message, IceCandidate):
            if self.session is None or not self.offered:
                raise ProtocolError(ErrorCode.BAD_ORDER, "send the offer before ICE candidates")
            try:
                await self.session.add_ice_candidate(message)
            except SessionNegotiationError as exc:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, str(exc)) from None
        elif isinstance(message, SessionEnd):
            if self.session is None:
                raise ProtocolError(ErrorCode.BAD_ORDER, "there is no session to end")
            await self.session.close("client_ended")

    async def _start(self) -> None:
        if self.session is not None:
            raise ProtocolError(ErrorCode.BAD_ORDER, "a session is already running here")
        session_id = uuid.uuid4().hex
        claim = await self.registry.claim(session_id)
        if claim is None:
            raise ProtocolError(ErrorCode.NO_CAPACITY, "every worker slot is busy; try again soon")
        self.claim = claim
        try:
            self.session = await self.workers[claim.worker_id].open_session(
                session_id, self._session_ended
            )
        except Exception:
            await self.registry.release(claim)
            self.claim = None
            raise
        self.offered = False
        self.metrics.sessions_started.inc()
        self.metrics.sessions_active.inc()
        stream = self.config.stream
        session_logger(__name__, session_id, worker=claim.worker_id).info("session.start")
        await self._send(
            SessionStarted(
                session_id=session_id,
                worker_id=claim.worker_id,
                width=stream.resolution.width,
                height=stream.resolution.height,
                fps=stream.fps,
                codec="H264",
                ice_servers=[IceServer(urls=[u]) for u in self.config.ice_servers],
            )
        )

    async def _offer(self, message: Offer) -> None:
        if self.session is None:
            raise ProtocolError(ErrorCode.BAD_ORDER, "send session.start before the offer")
        if self.offered:
            raise ProtocolError(
                ErrorCode.BAD_ORDER, "renegotiation is not supported: end and start a new session"
            )
        self.offered = True
        session = self.session
        try:
            sdp = await session.accept_offer(message.sdp)
        except SessionNegotiationError as exc:
            await self._send(Error(ErrorCode.BAD_OFFER, str(exc)))
            self.metrics.rejected.labels(ErrorCode.BAD_OFFER).inc()
            await session.close("bad_offer")
            return
        await self._send(Answer(sdp=sdp))

    async def _session_ended(self, reason: str) -> None:
        """Called once by the worker session, whoever ended it."""
        claim, self.claim, self.session, self.offered = self.claim, None, None, False
        if claim is not None:
            await self.registry.release(claim)
            self.metrics.sessions_active.dec()
            self.metrics.sessions_ended.labels(reason).inc()
            session_logger(__name__, claim.session_id).info("session.end", extra={"reason": reason})
        await self._send(SessionEnded(reason=reason))

    async def _end_session(self, reason: str) -> None:
        if self.session is not None:
            await self.session.close(reason)

    async def _reject(self, exc: ProtocolError) -> None:
        self.violations += 1
        self.metrics.rejected.labels(exc.code).inc()
        log.info("signaling.rejected", extra={"code": exc.code, "detail": exc.message[:200]})
        await self._send(Error(exc.code, exc.message))

    async def _send(self, message: ServerMessage) -> None:
        if not self.ws.closed:
            try:
                await self.ws.send_str(encode_message(message))
            except (ConnectionError, RuntimeError):
                pass  # the socket went away while we answered; `run` cleans up
