"""Health, readiness and metrics: what an orchestrator and Prometheus ask a replica."""

from __future__ import annotations

import asyncio

from aiohttp import web

from render_server.metrics import CONTENT_TYPE_LATEST
from render_server.signaling.edge import ctx_of


async def healthz(request: web.Request) -> web.Response:
    workers = await ctx_of(request).registry.workers()
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
        await asyncio.wait_for(ctx_of(request).registry.queue(), timeout=2.0)
    except Exception as exc:
        return web.json_response({"status": "unavailable", "reason": str(exc)[:200]}, status=503)
    return web.json_response({"status": "ready"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
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
