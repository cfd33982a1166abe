"""The aiohttp application of a signaling replica: the client pages, the browser and worker
sockets, the REST API, health and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from render_server.metrics import CONTENT_TYPE_LATEST
from render_server.protocol.bus import EndRequested
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import parse_requirements
from render_server.protocol.wire import MAX_MESSAGE_BYTES, SUBPROTOCOL
from render_server.signaling.audit import audit
from render_server.signaling.auth import (
    BROWSER_ROLES,
    ROLES,
    AuthError,
    Identity,
    Role,
    token_from_headers,
)
from render_server.signaling.browser_socket import BrowserConnection
from render_server.signaling.context import SignalingContext
from render_server.signaling.openapi import OPENAPI
from render_server.signaling.origin import origin_allowed
from render_server.signaling.relay import tell_lost
from render_server.signaling.session import SessionTable
from render_server.signaling.state.session_store import SessionRecord
from render_server.signaling.worker_socket import WorkerSocket

log = logging.getLogger(__name__)

# Messages between the app limit (an `error` reply) and this one are read then refused;
# anything larger is cut off by aiohttp, which closes the socket with 1009 (message too big).
WS_TRANSPORT_LIMIT = 2 * MAX_MESSAGE_BYTES
WS_HEARTBEAT_S = 20.0
MAX_REST_BODY = 4096

CONTEXT_KEY = web.AppKey("signaling", SignalingContext)
SESSIONS_KEY = web.AppKey("sessions", SessionTable)
BACKGROUND_KEY = web.AppKey("background", list)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self' ws: wss:; frame-ancestors 'self'"
)
EMBED_ORIGINS_PLACEHOLDER = "{{allowed_origins}}"


@web.middleware
async def security_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    if request.path.startswith("/client/"):
        # the SDK is public code: any site may load it as a module (which is a CORS fetch);
        # who may then open a stream is the signaling socket's business (Origin, token)
        response.headers.setdefault("Access-Control-Allow-Origin", "*")
        response.headers.setdefault("Cross-Origin-Resource-Policy", "cross-origin")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


def _ctx(request: web.Request) -> SignalingContext:
    return request.app[CONTEXT_KEY]


def _sessions(request: web.Request) -> SessionTable:
    return request.app[SESSIONS_KEY]


def _authenticate(request: web.Request, allowed: tuple[Role, ...]) -> Identity:
    """The caller's identity, or a refusal (401/403) that is logged and counted."""
    ctx = _ctx(request)
    token = token_from_headers(request.headers)
    try:
        return ctx.auth.verify(token, allowed)
    except AuthError as exc:
        ctx.metrics.rejected.labels(exc.code).inc()
        audit("audit.auth.rejected", path=request.path, peer=request.remote, code=exc.code,
              reason=exc.message)  # fmt: skip
        status = 401 if exc.code == "unauthorized" else 403
        raise _http_error(status, exc.code, exc.message) from None


def _http_error(status: int, code: str, message: str) -> web.HTTPException:
    classes: dict[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
        404: web.HTTPNotFound, 409: web.HTTPConflict, 413: web.HTTPRequestEntityTooLarge,
        503: web.HTTPServiceUnavailable,
    }  # fmt: skip
    cls = classes[status]
    kwargs: dict[str, Any] = {"max_size": MAX_REST_BODY, "actual_size": 0} if status == 413 else {}
    return cls(
        text=json.dumps({"code": code, "message": message}),
        content_type="application/json",
        **kwargs,
    )


def _check_origin(request: web.Request) -> None:
    ctx = _ctx(request)
    config = ctx.config
    ok, reason = origin_allowed(
        request.headers.get("Origin"), request.headers.get("Host"), config.host,
        config.allowed_origins,
    )  # fmt: skip
    if not ok:
        ctx.metrics.rejected.labels("origin").inc()
        audit("audit.origin.refused", reason=reason, peer=request.remote)
        raise _http_error(403, "origin", reason)


# -- pages ----------------------------------------------------------------------------------------


async def index(request: web.Request) -> web.StreamResponse:
    client_dir: Path = _ctx(request).config.client_dir
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}
    return web.FileResponse(client_dir / "index.html", headers=headers)


async def embed(request: web.Request) -> web.StreamResponse:
    """The iframe embed: framable by the server's own pages and the allowed origins only."""
    config = _ctx(request).config
    origins = " ".join(config.allowed_origins)
    template = (config.client_dir / "embed.html").read_text(encoding="utf-8")
    # origins are validated URLs (config), but escape anyway: this lands in an attribute
    page = template.replace(EMBED_ORIGINS_PLACEHOLDER, html.escape(origins, quote=True))
    csp = CSP.replace("frame-ancestors 'self'", f"frame-ancestors 'self' {origins}".strip())
    return web.Response(
        text=page, content_type="text/html",
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": csp},
    )  # fmt: skip


# -- sockets --------------------------------------------------------------------------------------


async def _socket(
    request: web.Request, allowed: tuple[Role, ...]
) -> tuple[web.WebSocketResponse, Identity]:
    _check_origin(request)
    identity = _authenticate(request, allowed)
    ws = web.WebSocketResponse(
        max_msg_size=WS_TRANSPORT_LIMIT, compress=False, heartbeat=WS_HEARTBEAT_S,
        protocols=(SUBPROTOCOL,),
    )  # fmt: skip
    await ws.prepare(request)
    return ws, identity


async def browser_socket(request: web.Request) -> web.StreamResponse:
    ws, identity = await _socket(request, BROWSER_ROLES)
    ctx = _ctx(request)
    ctx.metrics.connections.inc()
    ctx.browser_sockets.add(ws)
    try:
        await BrowserConnection(ws, _sessions(request), identity).run()
    finally:
        ctx.browser_sockets.discard(ws)
        ctx.metrics.connections.dec()
    return ws


async def worker_socket(request: web.Request) -> web.StreamResponse:
    ws, identity = await _socket(request, ("worker",))
    await WorkerSocket(ws, _ctx(request), identity).run()
    return ws


# -- REST -----------------------------------------------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_REST_BODY:
        raise _http_error(413, ErrorCode.TOO_LARGE, f"the body is over {MAX_REST_BODY} bytes")
    raw = await request.content.read(MAX_REST_BODY + 1)
    if len(raw) > MAX_REST_BODY:
        raise _http_error(413, ErrorCode.TOO_LARGE, f"the body is over {MAX_REST_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        raise _http_error(400, ErrorCode.BAD_JSON, "the body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise _http_error(400, ErrorCode.BAD_MESSAGE, "the body must be a JSON object")
    return doc


async def _own_record(request: web.Request, identity: Identity) -> SessionRecord:
    sid = request.match_info["session_id"]
    record = await _ctx(request).store.get(sid)
    if record is None:
        raise _http_error(404, ErrorCode.UNKNOWN_SESSION, "no such session")
    if not identity.anonymous and record.owner != identity.subject:
        audit("audit.api.refused", subject=identity.subject, session=sid)
        raise _http_error(403, ErrorCode.FORBIDDEN, "that session is not yours")
    return record


async def _describe(ctx: SignalingContext, record: SessionRecord) -> dict[str, Any]:
    worker = await ctx.registry.worker_of(record.session_id)
    position = await ctx.registry.position(record.session_id)
    return {
        "sessionId": record.session_id,
        "owner": record.owner,
        "role": record.role,
        "state": "assigned" if worker else "queued" if position else "pending",
        "workerId": worker,
        "position": position,
        "requirements": record.requirements.as_dict(),
        "created": record.created,
    }


async def create_session(request: web.Request) -> web.Response:
    identity = _authenticate(request, BROWSER_ROLES)
    ctx = _ctx(request)
    body = await _json_body(request)
    try:
        requirements = parse_requirements(body.get("requirements"))
    except ProtocolError as exc:
        raise _http_error(400, exc.code, exc.message) from None
    handle, token = await _sessions(request).create(identity.subject, identity.role, requirements)
    record = handle.record
    await handle.start()
    handle.detach()  # nobody is attached yet: the browser has the grace period to come
    doc = await _describe(ctx, record)
    doc.update(
        resumeToken=token,
        websocket="/ws",
        attach={"type": "session.resume", "sessionId": record.session_id, "resumeToken": token},
        attachWithinSeconds=ctx.config.resume_grace_s,
    )
    return web.json_response(doc, status=201)


async def get_session(request: web.Request) -> web.Response:
    identity = _authenticate(request, BROWSER_ROLES)
    record = await _own_record(request, identity)
    return web.json_response(await _describe(_ctx(request), record))


async def delete_session(request: web.Request) -> web.Response:
    identity = _authenticate(request, BROWSER_ROLES)
    ctx = _ctx(request)
    record = await _own_record(request, identity)
    handle = _sessions(request).get(record.session_id)
    if handle is not None:
        await handle.end("ended_by_api")
    else:  # held by another replica: it ends it
        await ctx.channels.to_session(record.session_id, EndRequested("ended_by_api"))
    return web.json_response({"sessionId": record.session_id, "ending": True}, status=202)


async def list_workers(request: web.Request) -> web.Response:
    _authenticate(request, ROLES)
    workers = await _ctx(request).registry.workers()
    return web.json_response(
        {
            "workers": [
                {
                    "id": w.info.worker_id,
                    "slots": w.info.slots,
                    "free": w.free,
                    "labels": list(w.info.labels),
                    "region": w.info.region,
                    "capabilities": w.info.capabilities,
                    "load": w.load,
                }
                for w in workers
            ]
        }
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)


# -- health and metrics ---------------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    workers = await _ctx(request).registry.workers()
    return web.json_response(
        {
            "status": "ok",
            "workers": len(workers),
            "slots": sum(w.info.slots for w in workers),
            "free": sum(w.free for w in workers),
        }
    )


async def readyz(request: web.Request) -> web.Response:
    """Ready when the registry answers: a replica that cannot reach Redis takes no browsers."""
    try:
        await asyncio.wait_for(_ctx(request).registry.queue(), timeout=2.0)
    except Exception as exc:
        return web.json_response({"status": "unavailable", "reason": str(exc)[:200]}, status=503)
    return web.json_response({"status": "ready"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    metrics = ctx.metrics
    workers = await ctx.registry.workers()
    metrics.workers.set(len(workers))
    metrics.slots_total.set(sum(w.info.slots for w in workers))
    metrics.slots_free.set(sum(w.free for w in workers))
    metrics.sessions_active.set(sum(len(w.sessions) for w in workers))
    metrics.queue_length.set(len(await ctx.registry.queue()))
    response = web.Response(body=metrics.render())
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


# -- background work ------------------------------------------------------------------------------


async def _sweep(ctx: SignalingContext) -> None:
    """Workers that stopped heart-beating (a replica that died took their sockets along)."""
    while True:
        await asyncio.sleep(ctx.config.heartbeat_s)
        try:
            expired = await ctx.registry.expire(ctx.config.heartbeat_timeout_s)
            for worker_id, claims in expired.items():
                await tell_lost(ctx, worker_id, claims, "heartbeat_timeout")
        except Exception:
            log.exception("scheduler.sweep_failed")


async def _start_background(app: web.Application) -> None:
    ctx = app[CONTEXT_KEY]
    await ctx.channels.on_queue(app[SESSIONS_KEY].on_queue_changed)
    app[BACKGROUND_KEY].append(asyncio.get_running_loop().create_task(_sweep(ctx)))


async def _close_browser_sockets(app: web.Application) -> None:
    # 1001 "going away": the SDK resumes its session on another replica straight away
    for ws in list(app[CONTEXT_KEY].browser_sockets):
        with contextlib.suppress(Exception):
            await ws.close(code=1001, message=b"server shutting down")


async def _stop_background(app: web.Application) -> None:
    for task in app[BACKGROUND_KEY]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await app[CONTEXT_KEY].close()


def create_app(ctx: SignalingContext) -> web.Application:
    app = web.Application(middlewares=[security_headers], client_max_size=64 * 1024)
    app[CONTEXT_KEY] = ctx
    app[SESSIONS_KEY] = SessionTable(ctx)
    app[BACKGROUND_KEY] = []
    app.on_startup.append(_start_background)
    app.on_shutdown.append(_close_browser_sockets)
    app.on_cleanup.append(_stop_background)
    app.router.add_get("/", index)
    app.router.add_get("/embed", embed)
    app.router.add_get("/ws", browser_socket)
    app.router.add_get("/worker", worker_socket)
    app.router.add_post("/api/sessions", create_session)
    app.router.add_get("/api/sessions/{session_id:[0-9a-f]{32}}", get_session)
    app.router.add_delete("/api/sessions/{session_id:[0-9a-f]{32}}", delete_session)
    app.router.add_get("/api/workers", list_workers)
    app.router.add_get("/api/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_static("/client/", ctx.config.client_dir, follow_symlinks=False)
    return app
