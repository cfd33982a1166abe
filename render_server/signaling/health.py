"""Health, readiness and metrics: what an orchestrator and Prometheus ask a replica."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from render_server.metrics import CONTENT_TYPE_LATEST
from render_server.signaling.edge import ctx_of
from render_server.signaling.state.registry import Registry


@dataclass(frozen=True)
class Fleet:
    """The registered workers, their slots, the free ones and the sessions on them, as the
    registry has them now (for /healthz and /metrics alike)."""

    workers: int
    slots: int
    free: int
    sessions: int

    @classmethod
    async def of(cls, registry: Registry) -> Fleet:
        workers = await registry.workers()
        return cls(
            workers=len(workers),
            slots=sum(w.info.slots for w in workers),
            free=sum(w.free for w in workers),
            sessions=sum(len(w.sessions) for w in workers),
        )


async def healthz(request: web.Request) -> web.Response:
    fleet = await Fleet.of(ctx_of(request).registry)
    return web.json_response(
        {"status": "ok", "workers": fleet.workers, "slots": fleet.slots, "free": fleet.free}
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
    fleet = await Fleet.of(ctx.registry)
    metrics.workers.set(fleet.workers)
    metrics.slots_total.set(fleet.slots)
    metrics.slots_free.set(fleet.free)
    metrics.sessions_active.set(fleet.sessions)
    metrics.queue_length.set(len(await ctx.registry.queue()))
    response = web.Response(body=metrics.render())
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response
