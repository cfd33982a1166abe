"""Limits below HTTP, on the TCP connections themselves: a deadline for a request's headers
(slowloris, and a connection that sends nothing), idle keep-alive connections closed, a cap on
the open connections of one peer and of the whole server, and malformed requests answered 400
with one short, rate-limited log line instead of a traceback.

aiohttp has no deadline for reading a request's headers, and counts no connections. The hook,
checked against aiohttp 3.14.5 (web_server.py, web_protocol.py, web_runner.py):

- `web.Server`, which `AppRunner.setup()` builds for the app, is aiohttp's protocol factory for
  `loop.create_server`. `listen` hands the loop another factory instead, which makes
  `GuardedRequestHandler`s (a subclass of the public `web.RequestHandler`) for that same
  Server, so that requests, keep-alive and graceful shutdown (`runner.cleanup()`) stay
  aiohttp's. The subclass overrides public methods only: `connection_made` and
  `connection_lost` (count; refuse over a cap before aiohttp sees the connection),
  `data_received` (arm the header deadline when a request starts to arrive),
  `finish_response` (a request is over), `log_exception` (malformed input: no traceback).
- The Server's public `request_factory`, which its handlers call once a request's head is
  parsed, is wrapped to disarm the deadline.
- aiohttp's own `keepalive_timeout` (a `RequestHandler` argument) closes idle connections.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http import RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader

from render_server.config import ServerConfig
from render_server.metrics import Metrics
from render_server.signaling.audit import Throttled

log = logging.getLogger(__name__)

RequestFactory = Callable[
    [
        RawRequestMessage,
        StreamReader,
        web.RequestHandler,
        AbstractStreamWriter,
        "asyncio.Task[None]",
    ],
    web.BaseRequest,
]
# what a client can provoke as often as it likes: logged at a rate, never as a traceback
MALFORMED = (HttpProcessingError, web.RequestPayloadError)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 15.0
    max_per_address: int = 64
    max_total: int = 4096

    @classmethod
    def of(cls, config: ServerConfig) -> ConnectionLimits:
        return cls(
            config.header_timeout_s, config.keepalive_timeout_s,
            config.max_connections_per_address, config.max_connections,
        )  # fmt: skip


class ConnectionGuard:
    """The open connections, by TCP peer address (behind a proxy: the proxy's)."""

    def __init__(self, limits: ConnectionLimits, metrics: Metrics | None = None) -> None:
        self.limits = limits
        self.metrics = metrics
        self.total = 0
        self._by_peer: Counter[str] = Counter()
        self._refusals = Throttled()
        self.notices = Throttled(log)  # header timeouts and malformed requests

    def admit(self, peer: str) -> bool:
        """Count a new connection from `peer`, or refuse it (False) over a cap."""
        if self.total >= self.limits.max_total:
            self._refuse(peer, "max_connections", self.limits.max_total)
            return False
        if self._by_peer[peer] >= self.limits.max_per_address:
            self._refuse(peer, "max_connections_per_address", self.limits.max_per_address)
            return False
        self._by_peer[peer] += 1
        self.total += 1
        return True

    def release(self, peer: str) -> None:
        self.total -= 1
        self._by_peer[peer] -= 1
        if self._by_peer[peer] <= 0:
            del self._by_peer[peer]

    def count(self, code: str) -> None:
        if self.metrics is not None:
            self.metrics.rejected.labels(code).inc()

    def _refuse(self, peer: str, reason: str, limit: int) -> None:
        self.count("connection_limit")
        self._refusals("audit.connection.refused", peer=peer, reason=reason, limit=limit)


def _peer_host(transport: asyncio.BaseTransport) -> str:
    peername = transport.get_extra_info("peername")
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return "unknown"  # a UNIX socket: one peer


class GuardedRequestHandler(web.RequestHandler):
    """aiohttp's connection, counted, with a deadline for each request's headers.

    The deadline runs from the connection's first byte of a request (from its opening, for the
    first request) to that request's head being parsed; while a request is handled (a
    WebSocket for hours) and while the connection is idle between requests it does not run:
    aiohttp's keep-alive timeout closes idle connections."""

    def __init__(
        self, manager: web.Server, guard: ConnectionGuard, *, loop: asyncio.AbstractEventLoop,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(manager, loop=loop, **kwargs)
        self._guard = guard
        self._guard_peer: str | None = None  # set once admitted
        self._guard_in_request = False
        self._guard_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = _peer_host(transport)
        if not self._guard.admit(peer):
            transport.close()  # before aiohttp knew of it: nothing to clean up but the socket
            return
        self._guard_peer = peer
        super().connection_made(transport)
        self._arm_deadline()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._guard_peer is None:
            return  # refused at connection_made
        self._disarm_deadline()
        self._guard.release(self._guard_peer)
        self._guard_peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._guard_peer is None:
            return
        if data and not self._guard_in_request and self._guard_deadline is None:
            self._arm_deadline()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def request_began(self) -> None:
        """The head of a request is parsed (called from the Server's request factory)."""
        self._guard_in_request = True
        self._disarm_deadline()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._guard_in_request = False

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """Every exception aiohttp's connection logs comes here (`handle_error` too: a request
        it could not parse is answered 400 there). Malformed input is the client's doing: one
        short line, at a rate; anything else is ours and keeps its traceback."""
        exc = kw.get("exc_info")
        if not isinstance(exc, MALFORMED):
            super().log_exception(*args, **kw)
            return
        self._guard.count("bad_http")
        first_line = str(getattr(exc, "message", "") or exc).strip().partition("\n")[0]
        self._guard.notices("http.bad_request", peer=self._guard_peer, error=type(exc).__name__,
                            reason=first_line[:80])  # fmt: skip

    def _arm_deadline(self) -> None:
        self._disarm_deadline()
        timeout = self._guard.limits.header_timeout_s
        self._guard_deadline = asyncio.get_running_loop().call_later(timeout, self._too_slow)

    def _disarm_deadline(self) -> None:
        if self._guard_deadline is not None:
            self._guard_deadline.cancel()
            self._guard_deadline = None

    def _too_slow(self) -> None:
        self._guard_deadline = None
        if self._guard_in_request or self._guard_peer is None:
            return
        self._guard.count("header_timeout")
        self._guard.notices("http.header_timeout", peer=self._guard_peer,
                            timeout_s=self._guard.limits.header_timeout_s)  # fmt: skip
        self.force_close()


def _announcing(factory: RequestFactory) -> RequestFactory:
    def request_factory(
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: web.RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        if isinstance(protocol, GuardedRequestHandler):
            protocol.request_began()
        return factory(message, payload, protocol, writer, task)

    return request_factory


async def listen(
    runner: web.AppRunner, host: str, port: int, limits: ConnectionLimits,
    metrics: Metrics | None = None, backlog: int = 128, tls: ssl.SSLContext | None = None,
) -> asyncio.Server:  # fmt: skip
    """Serve `runner`'s app (after `runner.setup()`) on host:port within `limits`, over TLS
    with `tls` (a handshake is held to the header timeout, as a request's headers are).

    Close the returned server before `runner.cleanup()`, which closes the connections."""
    server = runner.server
    if server is None:
        raise RuntimeError("call runner.setup() first")
    guard = ConnectionGuard(limits, metrics)
    server.request_factory = _announcing(server.request_factory)
    loop = asyncio.get_running_loop()

    def protocol() -> GuardedRequestHandler:
        # the arguments AppRunner(access_log=None) gives aiohttp's own handlers
        return GuardedRequestHandler(
            server, guard, loop=loop, keepalive_timeout=limits.keepalive_timeout_s,
            access_log=None,
        )  # fmt: skip

    if tls is None:
        return await loop.create_server(protocol, host, port, backlog=backlog)
    return await loop.create_server(
        protocol, host, port, backlog=backlog, ssl=tls,
        ssl_handshake_timeout=limits.header_timeout_s,
    )  # fmt: skip
