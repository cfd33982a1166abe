"""`render-server serve`: signaling, the client pages and one embedded worker in one process."""

from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import web

from .backends import Backends, choose_backends
from .config import ServerConfig
from .metrics import Metrics
from .render.scene import Scene, SceneLimits, default_scene, load_scene
from .signaling.app import create_app
from .signaling.registry import MemoryRegistry, WorkerInfo
from .worker.local import LocalWorker

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("local_worker", LocalWorker)


def load_configured_scene(config: ServerConfig) -> Scene:
    """The scene named by the config, or the default one; SceneError says what is wrong."""
    if config.scene is None:
        return default_scene()
    limits = SceneLimits(max_triangles=config.max_scene_triangles, max_bytes=config.max_scene_bytes)
    return load_scene(config.scene, limits)


async def build_app(
    config: ServerConfig, scene: Scene | None = None, backends: Backends | None = None
) -> web.Application:
    """The whole one-process server as an aiohttp app (tests run it on a free port).

    BackendUnavailable (a ConfigError) when `cuda` or `nvenc` was asked for and cannot run.
    """
    scene = scene if scene is not None else load_configured_scene(config)
    if backends is None:
        backends = choose_backends(config.stream.renderer, config.stream.encoder)
    metrics = Metrics()
    registry = MemoryRegistry()
    worker = LocalWorker(
        f"local-{socket.gethostname()}",
        scene,
        config.stream,
        config.slots,
        metrics,
        config.ice_servers,
        backends,
    )
    # numba compiles the renderer on the very first start (seconds), then loads it from its cache
    log.info("worker.warming_up", extra={"worker": worker.worker_id})
    seconds = await asyncio.get_running_loop().run_in_executor(None, worker.warm_up)
    log.info(
        "worker.ready",
        extra={
            "worker": worker.worker_id,
            "triangles": scene.triangle_count,
            "resolution": str(config.stream.resolution),
            "fps": config.stream.fps,
            "renderer": worker.backends.renderer,
            "encoder": worker.backends.encoder,
            "warm_up_s": round(seconds, 2),
        },
    )
    await registry.register(WorkerInfo(worker.worker_id, worker.slots, worker.capabilities))
    app = create_app(config, registry, {worker.worker_id: worker}, metrics)
    app[WORKER_KEY] = worker
    return app


class ListenError(OSError):
    """The server cannot listen where it was told to (port taken, address not ours)."""


async def run_server(config: ServerConfig) -> None:
    app = await build_app(config)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    host = f"[{config.host}]" if ":" in config.host else config.host
    print(f"render-server: streaming at http://{host}:{config.port}/  (Ctrl+C to stop)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
