"""Running the processes: `serve` (signaling + an embedded worker), `signaling`, `worker`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid

from aiohttp import web

from render_server.backends.choice import Backends, choose_backends
from render_server.config import ServerConfig, StreamConfig, WorkerConfig
from render_server.metrics import Metrics
from render_server.render.scene import Scene, SceneLimits, default_scene, load_scene
from render_server.signaling.app import create_app
from render_server.signaling.auth import Authenticator, load_keys
from render_server.signaling.context import SignalingContext
from render_server.signaling.state.bus import connect_bus
from render_server.signaling.state.redis_registry import connect_registry
from render_server.signaling.state.session_store import connect_session_store
from render_server.worker.embedded import EmbeddedWorker
from render_server.worker.local import LocalWorker

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("local_worker", LocalWorker)
EMBEDDED_KEY = web.AppKey("embedded_worker", EmbeddedWorker)


class ListenError(OSError):
    """The server cannot listen where it was told to (port taken, address not ours)."""


def load_configured_scene(config: ServerConfig | WorkerConfig) -> Scene:
    """The scene named by the config, or the default one; SceneError says what is wrong."""
    if config.scene is None:
        return default_scene()
    limits = SceneLimits(max_triangles=config.max_scene_triangles, max_bytes=config.max_scene_bytes)
    return load_scene(config.scene, limits)


def default_id(prefix: str) -> str:
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def build_context(config: ServerConfig, metrics: Metrics) -> SignalingContext:
    auth = Authenticator(load_keys(config.secret, config.key_file), config.auth_required)
    registry = await connect_registry(config.registry_url)
    bus = await connect_bus(config.registry_url)
    store = connect_session_store(config.registry_url)
    replica = config.replica_id or default_id("replica")
    return SignalingContext(config, registry, bus, store, metrics, auth, replica)


async def _warm_worker(worker: LocalWorker) -> None:
    # numba compiles the renderer on the very first start (seconds), then loads it from its cache
    log.info("worker.warming_up", extra={"worker": worker.worker_id})
    seconds = await asyncio.get_running_loop().run_in_executor(None, worker.warm_up)
    log.info(
        "worker.ready",
        extra={
            "worker": worker.worker_id,
            "triangles": worker.scene.triangle_count,
            "resolution": str(worker.stream.resolution),
            "fps": worker.stream.fps,
            "renderer": worker.backends.renderer,
            "encoder": worker.backends.encoder,
            "warm_up_s": round(seconds, 2),
        },
    )


async def build_app(
    config: ServerConfig, scene: Scene | None = None, backends: Backends | None = None
) -> web.Application:
    """A signaling replica as an aiohttp app, with `serve`'s embedded worker if configured.

    BackendUnavailable (a ConfigError) when `cuda` or `nvenc` was asked for and cannot run.
    """
    metrics = Metrics()
    if config.embedded_worker:
        scene = scene if scene is not None else load_configured_scene(config)
        if backends is None:
            backends = _backends(config.stream)
    ctx = await build_context(config, metrics)
    app = create_app(ctx)
    if config.embedded_worker:
        assert scene is not None
        worker = LocalWorker(
            f"local-{socket.gethostname()}", scene, config.stream, config.slots, metrics,
            config.ice_servers, backends,
        )  # fmt: skip
        await _warm_worker(worker)
        embedded = EmbeddedWorker(ctx, worker, config.heartbeat_s, config.labels, config.region)
        app[WORKER_KEY] = worker
        app[EMBEDDED_KEY] = embedded

        async def start(_: web.Application) -> None:
            await embedded.start()

        async def stop(_: web.Application) -> None:
            await embedded.stop()

        app.on_startup.append(start)
        app.on_shutdown.append(stop)
    return app


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
    what = "streaming" if config.embedded_worker else "signaling"
    auth = "on" if config.auth_required else "off"
    print(f"render-server: {what} at http://{host}:{config.port}/  (auth {auth}; Ctrl+C to stop)",
          flush=True)  # fmt: skip
    try:
        await _until_stopped()
    finally:
        await runner.cleanup()


def _backends(stream: StreamConfig) -> Backends:
    """The renderer and encoder the stream options ask for, resolved on this machine."""
    return choose_backends(stream.renderer, stream.encoder, nvenc_input=stream.nvenc_input)


async def run_worker(config: WorkerConfig) -> None:
    from render_server.worker.agent import WorkerAgent

    scene = load_configured_scene(config)
    backends = _backends(config.stream)
    worker_id = config.worker_id or default_id("worker")
    token = config.token
    if token is None and (config.secret or config.key_file):
        keys = load_keys(config.secret, config.key_file)
        token = Authenticator(keys).mint("worker", subject=worker_id, ttl_s=30 * 24 * 3600)
    worker = LocalWorker(worker_id, scene, config.stream, config.slots, Metrics(),
                         config.ice_servers, backends)  # fmt: skip
    await _warm_worker(worker)
    agent = WorkerAgent(worker, config.signaling_url, token, config.heartbeat_s, config.labels,
                        config.region)  # fmt: skip
    print(f"render-server: worker {worker_id} serving {config.slots} slots for "
          f"{config.signaling_url}", flush=True)  # fmt: skip
    run = asyncio.get_running_loop().create_task(agent.run())
    try:
        await _until_stopped()
    finally:
        await agent.stop()
        run.cancel()


async def _until_stopped() -> None:
    """Until SIGTERM (an orchestrator's stop) or Ctrl+C."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            # only the main thread may handle signals; elsewhere the caller stops the loop
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
