"""The aiohttp application: the client pages, the signaling socket, health and metrics."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from ..config import ServerConfig
from ..metrics import CONTENT_TYPE_LATEST, Metrics
from .connection import SignalingConnection
from .messages import MAX_MESSAGE_BYTES, ErrorCode
from .origin import origin_allowed
from .registry import Registry
from .workers import WorkerHandle

log = logging.getLogger(__name__)

# Messages between the app limit (an `error` reply) and this one are read then refused;
# anything larger is cut off by aiohttp, which closes the socket with 1009 (message too big).
WS_TRANSPORT_LIMIT = 2 * MAX_MESSAGE_BYTES
WS_HEARTBEAT_S = 20.0

CONFIG_KEY = web.AppKey("config", ServerConfig)
REGISTRY_KEY = web.AppKey("registry", Registry)
WORKERS_KEY = web.AppKey("workers", dict)
METRICS_KEY = web.AppKey("metrics", Metrics)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self' ws: wss:; frame-ancestors 'self'"
)


@web.middleware
async def security_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")
    return response


async def index(request: web.Request) -> web.StreamResponse:
    client_dir: Path = request.app[CONFIG_KEY].client_dir
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}
    return web.FileResponse(client_dir / "index.html", headers=headers)


async def signaling_socket(request: web.Request) -> web.StreamResponse:
    config = request.app[CONFIG_KEY]
    metrics = request.app[METRICS_KEY]
    ok, reason = origin_allowed(
        request.headers.get("Origin"),
        request.headers.get("Host"),
        config.host,
        config.allowed_origins,
    )
    if not ok:
        metrics.rejected.labels("origin").inc()
        log.warning("signaling.origin_refused", extra={"reason": reason, "peer": request.remote})
        raise web.HTTPForbidden(text=f"{reason}\n")
    ws = web.WebSocketResponse(
        max_msg_size=WS_TRANSPORT_LIMIT, compress=False, heartbeat=WS_HEARTBEAT_S
    )
    await ws.prepare(request)
    metrics.connections.inc()
    try:
        connection = SignalingConnection(
            ws, config, request.app[REGISTRY_KEY], request.app[WORKERS_KEY], metrics
        )
        await connection.run()
    finally:
        metrics.connections.dec()
    return ws


async def healthz(request: web.Request) -> web.Response:
    workers = await request.app[REGISTRY_KEY].workers()
    return web.json_response(
        {
            "status": "ok",
            "workers": len(workers),
            "slots": sum(w.info.slots for w in workers),
            "free": sum(w.free for w in workers),
        }
    )


async def list_workers(request: web.Request) -> web.Response:
    """The registered workers: what each one offers (GPU, renderer, encoders) and its load."""
    workers = await request.app[REGISTRY_KEY].workers()
    return web.json_response(
        {
            "workers": [
                {
                    "id": w.info.worker_id,
                    "slots": w.info.slots,
                    "free": w.free,
                    "capabilities": w.info.capabilities,
                }
                for w in workers
            ]
        }
    )


async def metrics_endpoint(request: web.Request) -> web.Response:
    metrics = request.app[METRICS_KEY]
    workers = await request.app[REGISTRY_KEY].workers()
    metrics.slots_total.set(sum(w.info.slots for w in workers))
    metrics.slots_free.set(sum(w.free for w in workers))
    response = web.Response(body=metrics.render())
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


def create_app(
    config: ServerConfig,
    registry: Registry,
    workers: dict[str, WorkerHandle],
    metrics: Metrics,
) -> web.Application:
    app = web.Application(middlewares=[security_headers], client_max_size=64 * 1024)
    app[CONFIG_KEY] = config
    app[REGISTRY_KEY] = registry
    app[WORKERS_KEY] = workers
    app[METRICS_KEY] = metrics
    app.router.add_get("/", index)
    app.router.add_get("/ws", signaling_socket)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/api/workers", list_workers)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_static("/client/", config.client_dir, follow_symlinks=False)
    return app


__all__ = ["ErrorCode", "create_app"]
