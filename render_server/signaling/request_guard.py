"""What every HTTP request meets before its route: the Host of a loopback-only server (DNS
rebinding), the Origin of a state-changing request or a WebSocket upgrade (cross-site request
forgery, cross-site WebSocket hijacking), and CORS for the REST API, answered for the
`--allow-origin` list only.

A browser sends a cross-site POST whose body is text/plain or a form without asking first (a
"simple request"); it always sends `Origin` with it. A page served from evil.example that
resolves to 127.0.0.1 is same-origin with the server as far as the browser knows, and only the
Host header tells: on a loopback bind every request's Host must be a loopback name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from render_server.protocol.errors import ErrorCode
from render_server.signaling.audit import Throttled
from render_server.signaling.edge import ORIGIN, client_address, ctx_of, http_error
from render_server.signaling.faults import OUTAGE_ERRORS
from render_server.signaling.origin import host_allowed, origin_allowed

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
API_PREFIX = "/api/"
CORS_METHODS = "GET, POST, DELETE"
CORS_HEADERS = "Authorization, Content-Type"
CORS_MAX_AGE_S = 600

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# one line per refusal, until a flood of them (a rebinding page in a loop) is rate limited
_refusals = Throttled(rate_per_s=2.0, burst=20.0)
# an outage fails every API call at once: a few lines say so, not one per call
_outages = Throttled(logging.getLogger(__name__), logging.WARNING, rate_per_s=0.2, burst=3.0)
UNAVAILABLE_MESSAGE = "the shared state (Redis) does not answer for now: try again shortly"
RETRY_AFTER_S = 1


def _refuse(request: web.Request, event: str, reason: str) -> web.HTTPException:
    ctx_of(request).metrics.rejected.labels(ORIGIN).inc()
    _refusals(event, reason=reason, method=request.method, path=request.path,
              peer=client_address(request))  # fmt: skip
    return http_error(403, ORIGIN, reason)


def _preflight(request: web.Request, origin: str, allowed: tuple[str, ...]) -> web.Response:
    """The answer to a CORS preflight: permission for an allow-listed origin, else none."""
    if origin.rstrip("/") not in allowed:
        refusal = _refuse(request, "audit.cors.refused", f"Origin {origin!r} is not allow-listed")
        refusal.headers["Vary"] = "Origin"
        raise refusal
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": CORS_METHODS,
            "Access-Control-Allow-Headers": CORS_HEADERS,
            "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
            "Vary": "Origin",
        },
    )


def _cors_headers(
    response: web.StreamResponse, origin: str | None, allowed: tuple[str, ...]
) -> None:
    # the answer depends on Origin: a cache must not hand one origin's answer to another
    vary = response.headers.get("Vary")
    if vary is None:
        response.headers["Vary"] = "Origin"
    elif "origin" not in vary.lower():
        response.headers["Vary"] = f"{vary}, Origin"
    if origin is not None and origin.rstrip("/") in allowed:
        response.headers["Access-Control-Allow-Origin"] = origin


def _is_upgrade(request: web.Request) -> bool:
    """A WebSocket upgrade (as aiohttp tells one): it drives a stream as a POST changes state."""
    return request.headers.get("Upgrade", "").lower().strip() == "websocket"


@web.middleware
async def request_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = ctx_of(request).config
    host = request.headers.get("Host")
    origin = request.headers.get("Origin")
    ok, reason = host_allowed(host, config.host)
    if not ok:
        raise _refuse(request, "audit.host.refused", reason)
    api = request.path.startswith(API_PREFIX)
    preflight = request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
    if api and preflight and origin is not None:
        return _preflight(request, origin, config.allowed_origins)
    # a WebSocket upgrade is checked without an Origin too: one without a Host is refused
    if _is_upgrade(request) or (request.method in STATE_CHANGING and origin is not None):
        ok, reason = origin_allowed(origin, host, config.host, config.allowed_origins)
        if not ok:
            raise _refuse(request, "audit.origin.refused", reason)
    if not api:
        return await handler(request)
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # errors too: the page reads why it was refused
        _cors_headers(exc, origin, config.allowed_origins)
        raise
    except OUTAGE_ERRORS as exc:  # Redis away or stalled: not a bug, and the caller may retry
        _outages("rest.unavailable", path=request.path, error=repr(exc)[:200])
        unavailable = http_error(503, ErrorCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)
        unavailable.headers["Retry-After"] = str(RETRY_AFTER_S)
        _cors_headers(unavailable, origin, config.allowed_origins)
        raise unavailable from None
    _cors_headers(response, origin, config.allowed_origins)
    return response
