"""A worker process's status port (`--metrics-port`): `/metrics` (Prometheus text of the
worker's registry, with `render_worker_draining`, `render_worker_sessions` and
`render_worker_signaling_connected`), `/healthz` (liveness: the process answers; it never
depends on signaling), `/readyz` (200 while registered and not draining, else 503 with the
reason) and `POST /drain`, which starts the drain as SIGTERM would, for a Kubernetes `preStop`
hook (`render-server drain`). Only a caller on the loopback interface, that is inside the pod,
may drain: the port itself is open to the cluster for scraping and probes."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from render_server.metrics import CONTENT_TYPE_LATEST, Metrics

log = logging.getLogger(__name__)

Status = Callable[[], dict[str, Any]]  # {"draining": bool, "registered": bool, "sessions": int}
Drain = Callable[[str], object]  # starts the drain, its reason given; a drain under way goes on


class StatusServer:
    def __init__(
        self, status: Status, metrics: Metrics, host: str, port: int, drain: Drain | None = None
    ) -> None:
        self.status = status
        self.drain = drain
        self.metrics = metrics
        self.gauges = metrics.worker_status()
        self.host = host
        self.port = port
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_post("/drain", self._drain)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> int:
        """Listen; the port bound (the one asked for, or a free one for 0)."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        try:
            await site.start()
        except OSError as exc:  # a taken port: one line and exit code 2 (`run_process`)
            await self._runner.cleanup()
            where = f"{self.host}:{self.port}"
            raise ConnectionError(f"cannot listen on {where} (--metrics-port): {exc}") from exc
        server = site._server  # aiohttp keeps the listening sockets there
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("worker.status_port", extra={"host": self.host, "port": self.port})
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()

    def _now(self) -> dict[str, Any]:
        status = self.status()
        self.gauges.draining.set(1 if status["draining"] else 0)
        self.gauges.sessions.set(status["sessions"])
        self.gauges.signaling_connected.set(1 if status["registered"] else 0)
        return status

    async def _metrics(self, _: web.Request) -> web.Response:
        self._now()
        response = web.Response(body=self.metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **self._now()})

    async def _readyz(self, _: web.Request) -> web.Response:
        status = self._now()
        if status["draining"]:
            return web.json_response({"status": "not_ready", "reason": "draining"}, status=503)
        if not status["registered"]:
            reason = "not_registered"
            return web.json_response({"status": "not_ready", "reason": reason}, status=503)
        return web.json_response({"status": "ready", **status})

    async def _drain(self, request: web.Request) -> web.Response:
        if not _loopback(request.remote):
            log.warning("worker.drain_refused", extra={"peer": request.remote})
            message = "only a caller inside the worker's host or pod (loopback) may drain it"
            return web.json_response({"code": "forbidden", "message": message}, status=403)
        if self.drain is None:
            message = "this process cannot be drained"
            return web.json_response({"code": "unavailable", "message": message}, status=503)
        self.drain("prestop")
        return web.json_response({"status": "draining", **self._now()}, status=202)


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote).is_loopback
    except ValueError:  # a Unix socket's peer, or none
        return False


__all__ = ["StatusServer"]
