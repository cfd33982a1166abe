"""Liveness, readiness and metrics: what an orchestrator and Prometheus ask a replica.

- `/healthz` (liveness) answers 200 at once from what the process knows: it never waits on the
  shared state, so a Redis outage never gets healthy replicas restarted. It says whether the
  state answered last time (`state`, `downForS`) and the last fleet figures read, with their age.
- `/readyz` (readiness) answers 503 while the replica stops, or when the registry does not
  answer within READY_TIMEOUT_S: a replica that cannot reach its state takes no browsers.
- `/metrics` renders every process-local metric whatever the state does; the fleet's gauges
  are read from the registry within FLEET_TIMEOUT_S, and `render_state_store_up` says whether
  that read answered (the fleet gauges keep their last values when it did not).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from render_server.metrics import CONTENT_TYPE_LATEST
from render_server.signaling.context import SignalingContext
from render_server.signaling.edge import ctx_of
from render_server.signaling.faults import OUTAGE_ERRORS
from render_server.signaling.state.outage import Fleet

__all__ = ["Fleet", "healthz", "metrics_endpoint", "readyz", "refresh_fleet"]

log = logging.getLogger(__name__)

T = TypeVar("T")

READY_TIMEOUT_S = 1.0
FLEET_TIMEOUT_S = 1.0
READY_PROBE = "readyz"  # a session id nobody has: the probe reads one hash field


async def refresh_fleet(ctx: SignalingContext, timeout_s: float = FLEET_TIMEOUT_S) -> Fleet | None:
    """Read the fleet's figures (within `timeout_s`) and keep them for `/healthz`; None, with
    the failure noted in `ctx.state_health`, when the registry did not answer."""
    fleet = await _read(ctx, Fleet.of(ctx.registry), timeout_s)
    if fleet is not None:
        ctx.state_health.remember(fleet)
    return fleet


async def _read(ctx: SignalingContext, aw: Awaitable[T], timeout_s: float) -> T | None:
    """`aw`'s result within `timeout_s`, the outcome noted; None when it did not answer (an
    outage) or raised anything else (a bug: logged with its traceback)."""
    try:
        return await ctx.state_health.call(aw, timeout_s)
    except OUTAGE_ERRORS:
        return None
    except Exception:
        log.exception("health.state_read_failed")
        return None


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


async def healthz(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    health = ctx.state_health
    fleet = health.fleet
    doc: dict[str, Any] = {
        "status": "ok",
        "replica": ctx.replica_id,
        "state": "up" if health.up else "down",
        "downForS": _rounded(health.down_for()),
        "stopping": ctx.stopping,
        "workers": None if fleet is None else fleet.workers,
        "slots": None if fleet is None else fleet.slots,
        "free": None if fleet is None else fleet.free,
        "fleetAgeS": _rounded(health.fleet_age()),
    }
    return web.json_response(doc)


async def readyz(request: web.Request) -> web.Response:
    """Ready while not stopping and the registry answers within READY_TIMEOUT_S."""
    ctx = ctx_of(request)
    if ctx.stopping:
        return web.json_response({"status": "unavailable", "reason": "stopping"}, status=503)
    probe = ctx.registry.worker_of(READY_PROBE)
    if not await ctx.state_health.check(probe, READY_TIMEOUT_S):
        reason = f"the shared state does not answer: {ctx.state_health.last_error}"
        return web.json_response({"status": "unavailable", "reason": reason[:200]}, status=503)
    return web.json_response({"status": "ready"})


async def _fleet_and_queue(ctx: SignalingContext) -> tuple[Fleet, int]:
    return await Fleet.of(ctx.registry), len(await ctx.registry.queue())


def _state_gauge(up: bool) -> bytes:
    """`render_state_store_up`, on a registry of its own (merged into the page as text)."""
    registry = CollectorRegistry()
    gauge = Gauge(
        "render_state_store_up",
        "1 when the shared state (the registry) answered this scrape's read, else 0",
        registry=registry,
    )
    gauge.set(1 if up else 0)
    return generate_latest(registry)


async def metrics_endpoint(request: web.Request) -> web.Response:
    ctx = ctx_of(request)
    metrics = ctx.metrics
    read = await _read(ctx, _fleet_and_queue(ctx), FLEET_TIMEOUT_S)
    if read is not None:
        fleet, queued = read
        ctx.state_health.remember(fleet)
        metrics.workers.set(fleet.workers)
        metrics.slots_total.set(fleet.slots)
        metrics.slots_free.set(fleet.free)
        metrics.sessions_active.set(fleet.sessions)
        metrics.queue_length.set(queued)
    response = web.Response(body=metrics.render() + _state_gauge(read is not None))
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response
