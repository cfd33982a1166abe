"""What the browser socket and the worker socket both do with their peer's messages: a rate
(a token bucket, one audit line per burst over it), every refusal answered with a coded `error`
and counted, a failure of ours answered `internal` and logged, and the socket closed (1008)
right after `max_violations` refusals."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from render_server.metrics import Metrics
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.rate_limit import TokenBucket
from render_server.protocol.signaling import Error
from render_server.protocol.wire import encode_message
from render_server.signaling.audit import audit, audit_refusal

log = logging.getLogger(__name__)

MAX_VIOLATIONS = 100  # refused messages before a socket is closed


class MessageGuard:
    """One socket's guard. `channel` names it in log lines (`{channel}.internal_error`,
    `{channel}.rejected`) and in the rate-limit audit line; `subject` is its token's."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        metrics: Metrics,
        subject: str,
        *,
        channel: str,
        rate_per_s: float,
        burst: float,
        max_violations: int = MAX_VIOLATIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ws = ws
        self.metrics = metrics
        self.subject = subject
        self.channel = channel
        self.rate_per_s = rate_per_s
        self.max_violations = max_violations
        self.violations = 0
        self._bucket = TokenBucket(rate_per_s, burst)
        self._clock = clock
        self._rate_noticed = False

    def admit(self) -> None:
        """Take one message's token; ProtocolError `rate_limited` when over the rate."""
        if self._bucket.take(self._clock()):
            self._rate_noticed = False
            return
        if not self._rate_noticed:  # one audit line per burst, not one per message
            audit("audit.rate_limited", subject=self.subject, channel=self.channel)
        self._rate_noticed = True
        raise ProtocolError(ErrorCode.RATE_LIMITED, f"over {self.rate_per_s:g} messages/s")

    async def reject(self, exc: ProtocolError) -> None:
        """A refused message: counted, and answered with its code."""
        self.violations += 1
        self.metrics.rejected.labels(exc.code).inc()
        if exc.code == ErrorCode.TOO_LARGE:
            audit_refusal("audit.message.too_large", subject=self.subject)
        log.info(f"{self.channel}.rejected", extra={"code": exc.code, "detail": exc.message[:200]})
        await self.send(encode_message(Error(exc.code, exc.message)))

    async def internal_error(self, **facts: Any) -> None:
        """A bug of ours in one message's handling (call it in an `except`): logged with its
        traceback and `facts`, answered `internal`; the socket stays open."""
        log.exception(f"{self.channel}.internal_error", extra=facts)
        await self.reject(ProtocolError(ErrorCode.INTERNAL, "internal server error"))

    async def unavailable(self, exc: BaseException) -> None:
        """The shared state (Redis) is out of reach: answered `unavailable` (the client tries
        again), logged without a traceback, not counted against the peer."""
        log.warning(f"{self.channel}.unavailable", extra={"error": repr(exc)[:200]})
        self.metrics.rejected.labels(ErrorCode.UNAVAILABLE).inc()
        text = "the server's shared state is unreachable for now: try again in a few seconds"
        await self.send(encode_message(Error(ErrorCode.UNAVAILABLE, text)))

    @property
    def exhausted(self) -> bool:
        """Whether the peer has had its `max_violations` refusals: `close` the socket now."""
        return self.violations >= self.max_violations

    async def close(self) -> None:
        audit("audit.socket.closed", subject=self.subject, reason="too many rejected messages")
        await self.ws.close(code=1008, message=b"too many rejected messages")

    async def send(self, text: str) -> None:
        """Send, unless the socket has gone (it may go while we answer: its loop cleans up)."""
        if not self.ws.closed:
            try:
                await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                pass
