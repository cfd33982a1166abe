"""The aiohttp application of a signaling replica: its routes (pages, the browser and worker
sockets, the REST API, health and metrics) and its background work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref

from aiohttp import web

from render_server.protocol.wire import MAX_MESSAGE_BYTES, SUBPROTOCOL
from render_server.protocol.worker import CloseSession
from render_server.signaling import health, pages, rest, scene_api
from render_server.signaling.auth import BROWSER_ROLES, Identity, Role
from render_server.signaling.browser_socket import BrowserConnection
from render_server.signaling.context import SignalingContext
from render_server.signaling.edge import (
    CONTEXT_KEY,
    SESSIONS_KEY,
    authenticate,
    client_address,
    ctx_of,
    sessions_of,
)
from render_server.signaling.faults import is_outage
from render_server.signaling.relay import publish_assignments, tell_lost
from render_server.signaling.request_guard import request_guard
from render_server.signaling.scene_api import SceneService, open_scene_service
from render_server.signaling.session_table import SessionTable
from render_server.signaling.worker_socket import GOING_AWAY, WorkerSocket

log = logging.getLogger(__name__)

# Messages between the app limit (an `error` reply) and this one are read then refused;
# anything larger is cut off by aiohttp, which closes the socket with 1009 (message too big).
WS_TRANSPORT_LIMIT = 2 * MAX_MESSAGE_BYTES
WS_HEARTBEAT_S = 20.0

BACKGROUND_KEY = web.AppKey("background", list)
WORKER_SOCKETS_KEY = web.AppKey("worker_sockets", weakref.WeakSet)
PENDING_LOSSES_KEY = web.AppKey("pending_losses", set)


async def _socket(
    request: web.Request, allowed: tuple[Role, ...], watching: bool = False
) -> tuple[web.WebSocketResponse, Identity]:
    # the Origin and Host were checked before the route (request_guard: an upgrade is checked
    # as a state-changing request is)
    identity = authenticate(request, allowed, watching)
    ws = web.WebSocketResponse(
        max_msg_size=WS_TRANSPORT_LIMIT, compress=False, heartbeat=WS_HEARTBEAT_S,
        protocols=(SUBPROTOCOL,),
    )  # fmt: skip
    await ws.prepare(request)
    return ws, identity


async def browser_socket(request: web.Request) -> web.StreamResponse:
    ws, identity = await _socket(request, BROWSER_ROLES, watching=True)
    ctx = ctx_of(request)
    ctx.metrics.connections.inc()
    ctx.browser_sockets.add(ws)
    try:
        await BrowserConnection(ws, sessions_of(request), identity, client_address(request)).run()
    finally:
        ctx.browser_sockets.discard(ws)
        ctx.metrics.connections.dec()
    return ws


async def worker_socket(request: web.Request) -> web.StreamResponse:
    ws, identity = await _socket(request, ("worker",))
    request.app[WORKER_SOCKETS_KEY].add(ws)
    try:
        await WorkerSocket(ws, ctx_of(request), identity, request.app[PENDING_LOSSES_KEY]).run()
    finally:
        request.app[WORKER_SOCKETS_KEY].discard(ws)
    return ws


async def _sweep(ctx: SignalingContext) -> None:
    """Workers that stopped heart-beating (a replica that died took their sockets along), and
    claims and queue places whose replica stopped renewing them (it died)."""
    while True:
        await asyncio.sleep(ctx.config.heartbeat_s / 2)  # a silent worker is found soon after
        try:
            await sweep_once(ctx)
            ctx.state_health.ok()
            await health.refresh_fleet(ctx)  # /healthz's figures, read here, never there
        except Exception as exc:
            if not is_outage(exc):
                log.exception("scheduler.sweep_failed")
            else:  # StateHealth logs the outage once
                ctx.state_health.failed(exc)


async def sweep_once(ctx: SignalingContext) -> None:
    # while the shared state was away no worker could beat: their silence then is no sign of
    # death, so expiry waits until the state has been back for a whole heartbeat timeout
    if ctx.state_health.stable_for() >= ctx.config.heartbeat_timeout_s:
        expired = await ctx.registry.expire(ctx.config.heartbeat_timeout_s)
        for worker_id, claims in expired.items():
            await tell_lost(ctx, worker_id, claims, "heartbeat_timeout")
    lapsed = await ctx.registry.expire_leases()
    for claim in lapsed.released:  # nobody holds the browser: the worker lets the session go
        await ctx.channels.to_worker(
            claim.worker_id, CloseSession(claim.session_id, "lease_expired")
        )
    if lapsed.released or lapsed.dropped:
        log.info("scheduler.leases_expired",
                 extra={"claims": len(lapsed.released), "queued": len(lapsed.dropped)})  # fmt: skip
    await publish_assignments(ctx, lapsed.served)
    if lapsed.dropped and not lapsed.served:
        await ctx.channels.queue_changed()


async def _start_background(app: web.Application) -> None:
    ctx = app[CONTEXT_KEY]
    await ctx.channels.on_queue(app[SESSIONS_KEY].on_queue_changed)
    loop = asyncio.get_running_loop()
    app[BACKGROUND_KEY].append(loop.create_task(_sweep(ctx)))
    app[BACKGROUND_KEY].append(loop.create_task(app[SESSIONS_KEY].keep_alive()))


async def _close_sockets(app: web.Application) -> None:
    """The replica stops: it is no longer ready, its browsers resume their sessions on another
    replica and its workers register through another one, at once (1012, "service restart");
    sessions and media go on. A worker whose socket closes here is not waited for."""
    ctx = app[CONTEXT_KEY]
    ctx.stopping = True
    sockets = [*app[WORKER_SOCKETS_KEY], *ctx.browser_sockets]

    # what closing a socket can raise (aiohttp 3.14 keeps most failures to the socket, in
    # `ws.exception()`): RuntimeError for one not prepared, ConnectionError for a peer
    # gone; one such socket must not keep the others from closing. A bug still shows.
    async def close(ws: web.WebSocketResponse) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close(code=GOING_AWAY, message=b"server restarting: reconnect")

    await asyncio.gather(*(close(ws) for ws in sockets))


async def _stop_background(app: web.Application) -> None:
    for task in [*app[BACKGROUND_KEY], *app[PENDING_LOSSES_KEY]]:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await app[CONTEXT_KEY].close()


def create_app(ctx: SignalingContext, scenes: SceneService | None = None) -> web.Application:
    """The replica's app; `scenes`: its store of uploaded scenes, opened from the config
    (`--scene-dir`) when not given (ConfigError for a folder that cannot be used)."""
    if scenes is None:
        scenes = open_scene_service(ctx.config, ctx.auth)
    # outermost first: every answer gets the security headers, refusals of the guard included;
    # the body limit is for bodies read whole: an upload streams (signaling/scene_api.py)
    app = web.Application(
        middlewares=[pages.security_headers, request_guard], client_max_size=64 * 1024
    )
    app[CONTEXT_KEY] = ctx
    app[SESSIONS_KEY] = SessionTable(ctx)
    app[BACKGROUND_KEY] = []
    app[WORKER_SOCKETS_KEY] = weakref.WeakSet()
    app[PENDING_LOSSES_KEY] = set()
    app.on_startup.append(_start_background)
    app.on_shutdown.append(_close_sockets)
    app.on_cleanup.append(_stop_background)
    app.router.add_get("/", pages.index)
    app.router.add_get("/embed", pages.embed)
    app.router.add_get("/ws", browser_socket)
    app.router.add_get("/worker", worker_socket)
    app.router.add_post("/api/sessions", rest.create_session)
    app.router.add_get("/api/sessions/{session_id:[0-9a-f]{32}}", rest.get_session)
    app.router.add_delete("/api/sessions/{session_id:[0-9a-f]{32}}", rest.delete_session)
    app.router.add_get("/api/workers", rest.list_workers)
    app.router.add_post("/api/workers/{workerId}/drain", rest.drain_worker)
    scene_api.install(app, scenes)
    app.router.add_get("/api/openapi.json", rest.openapi)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics_endpoint)
    app.router.add_get("/client/examples", pages.examples)
    app.router.add_get("/client/examples/", pages.examples)
    app.router.add_static("/client/", ctx.config.client_dir, follow_symlinks=False)
    return app
