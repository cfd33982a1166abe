"""What every HTTP request of a signaling replica meets first: the app's shared state, the
caller's identity and address, and errors as JSON documents (the Origin and Host checks are the
`request_guard` middleware's)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from render_server.signaling.audit import audit_refusal
from render_server.signaling.auth import AuthError, Identity, Role, token_from_headers
from render_server.signaling.context import SignalingContext
from render_server.signaling.forwarded import forwarded_client
from render_server.signaling.session_table import SessionTable

MAX_REST_BODY = 4096
# REST-only codes (the sockets' are protocol.errors.ErrorCode)
ORIGIN = "origin"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"

CONTEXT_KEY = web.AppKey("signaling", SignalingContext)
SESSIONS_KEY = web.AppKey("sessions", SessionTable)


def ctx_of(request: web.Request) -> SignalingContext:
    return request.app[CONTEXT_KEY]


def sessions_of(request: web.Request) -> SessionTable:
    return request.app[SESSIONS_KEY]


def authenticate(
    request: web.Request, allowed: tuple[Role, ...], watching: bool = False
) -> Identity:
    """The caller's identity, or a refusal (401/403) that is logged and counted. A share
    link's token (bound to one session) opens only the browser socket, to watch (`watching`):
    a link's holder neither starts sessions nor reads the fleet."""
    ctx = ctx_of(request)
    token = token_from_headers(request.headers)
    try:
        identity = ctx.auth.verify(token, allowed)
        if identity.session is not None and not watching:
            raise AuthError("forbidden", "a share link's token can only watch its session")
        return identity
    except AuthError as exc:
        ctx.metrics.rejected.labels(exc.code).inc()
        audit_refusal("audit.auth.rejected", path=request.path, peer=request.remote,
                      code=exc.code, reason=exc.message)  # fmt: skip
        status = 401 if exc.code == "unauthorized" else 403
        raise http_error(status, exc.code, exc.message) from None


def http_error(status: int, code: str, message: str) -> web.HTTPException:
    classes: dict[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
        404: web.HTTPNotFound, 409: web.HTTPConflict, 413: web.HTTPRequestEntityTooLarge,
        415: web.HTTPUnsupportedMediaType, 429: web.HTTPTooManyRequests,
        503: web.HTTPServiceUnavailable,
    }  # fmt: skip
    cls = classes[status]
    kwargs: dict[str, Any] = {"max_size": MAX_REST_BODY, "actual_size": 0} if status == 413 else {}
    return cls(
        text=json.dumps({"code": code, "message": message}),
        content_type="application/json",
        **kwargs,
    )


def client_address(request: web.Request) -> str:
    """The address a request came from, for per-client limits and the audit log: the TCP peer,
    or, when that peer is a `--trusted-proxy`, the client its X-Forwarded-For names."""
    return forwarded_client(
        request.remote or "unknown",
        request.headers.getall("X-Forwarded-For", ()),
        ctx_of(request).config.trusted_proxies,
    )
