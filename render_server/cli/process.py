"""The server processes: `serve`'s app (a signaling replica with an embedded worker), a
signaling replica, a worker process; the scene and worker they start with, how they stop, and
how a failure at start reaches the operator (one line on stderr, exit code 2).

Imported when a server command runs, not for `--help`: it loads aiortc, numba and trimesh."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import uuid
from collections.abc import Coroutine
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from render_server.backends.choice import Backends, BackendUnavailable, choose_backends
from render_server.config import ServerConfig, WorkerConfig
from render_server.loop_lag import watch_event_loop
from render_server.memory import fix_mmap_threshold, settle_heap, size_datagram_reads
from render_server.metrics import Metrics
from render_server.render.builtin_scenes import default_scene
from render_server.render.scene import Scene, SceneError
from render_server.render.scene_files import SceneLimits, load_scene
from render_server.signaling.app import create_app
from render_server.signaling.auth import Authenticator, load_keys
from render_server.signaling.connection_limits import ConnectionLimits, listen
from render_server.signaling.context import connect_context
from render_server.signaling.edge import CONTEXT_KEY
from render_server.signaling.local_worker_link import LocalWorkerLink
from render_server.signaling.scene_api import open_scene_service
from render_server.signaling.tls import server_context
from render_server.signals import on_stop_signals
from render_server.stream.scene_fetch import SceneFetcher, SceneSource
from render_server.worker.agent import WorkerAgent
from render_server.worker.embedded import EmbeddedWorker
from render_server.worker.lifecycle import serve_worker
from render_server.worker.local import LocalWorker
from render_server.worker.pool_children import ChildStartError, WorkerPool

log = logging.getLogger(__name__)

WORKER_KEY = web.AppKey("local_worker", LocalWorker)
EMBEDDED_KEY = web.AppKey("embedded_worker", EmbeddedWorker)
SELF_MINTED_TOKEN_TTL_S = 30 * 24 * 3600  # a worker minting its own token from the secret


class ListenError(OSError):
    """The server cannot listen where it was told to (port taken, address not ours)."""


def default_id(prefix: str) -> str:
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def load_configured_scene(config: ServerConfig | WorkerConfig) -> Scene:
    """The scene named by the config, or the default one; SceneError says what is wrong."""
    if config.scene is None:
        return default_scene()
    return load_scene(config.scene, scene_limits(config))


def scene_limits(config: ServerConfig | WorkerConfig) -> SceneLimits:
    return SceneLimits(max_triangles=config.max_scene_triangles, max_bytes=config.max_scene_bytes)


def signaling_http_url(signaling_url: str) -> str:
    """Signaling's HTTP base from a worker's `--signaling` URL (ws://host:port/worker)."""
    parts = urlsplit(signaling_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    base = path[: -len("/worker")] if path.endswith("/worker") else ""  # behind a path prefix
    return urlunsplit((scheme, parts.netloc, base, "", ""))


async def start_local_worker(
    worker_id: str,
    config: ServerConfig | WorkerConfig,
    metrics: Metrics,
    scene: Scene | None = None,
    backends: Backends | None = None,
    scene_source: SceneSource | None = None,
) -> LocalWorker:
    """A worker of this process, warmed up: renderer compiled, an encoder opened once.
    `backends` default to what the stream options ask for, resolved on this machine;
    `scene_source`: where its sessions read uploaded scenes (None: loadScene is refused)."""
    if scene is None:
        scene = load_configured_scene(config)
    stream = config.stream
    if backends is None:
        backends = choose_backends(stream.renderer, stream.encoder, nvenc_input=stream.nvenc_input)
    fetcher = None if scene_source is None else SceneFetcher(scene_source, scene_limits(config))
    worker = LocalWorker(
        worker_id, scene, stream, config.slots, metrics, config.ice_servers, backends, fetcher
    )
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
    return worker


async def start_worker(
    worker_id: str,
    config: ServerConfig | WorkerConfig,
    metrics: Metrics,
    scene: Scene | None = None,
    backends: Backends | None = None,
    scene_source: SceneSource | None = None,
) -> tuple[LocalWorker, WorkerPool | None]:
    """The worker of this process: warmed up here (`--processes 1`), or serving from child
    processes that are started and warmed up now; then this process's LocalWorker only says
    what the worker is (capabilities, slots) and holds the merged metrics."""
    if config.processes <= 1:
        worker = await start_local_worker(worker_id, config, metrics, scene, backends, scene_source)
        return worker, None
    if scene is None:
        scene = load_configured_scene(config)  # a scene that cannot load stops the start here
    stream = config.stream
    if backends is None:
        backends = choose_backends(stream.renderer, stream.encoder, nvenc_input=stream.nvenc_input)
    worker = LocalWorker(
        worker_id, scene, stream, config.slots, metrics, config.ice_servers, backends
    )
    setup = {
        "config": config,
        "worker_id": worker_id,
        "log_level": logging.getLevelName(logging.getLogger().level),
        # a scene given in code (tests) travels; a configured one is loaded by each child
        "scene": scene if config.scene is None else None,
        "scene_source": scene_source,
    }
    command = (sys.executable, "-m", "render_server.cli.pool_child")
    pool = WorkerPool(command, setup, config.slots, config.processes)
    await pool.start()
    log.info("worker.pool_ready", extra={"worker": worker_id, "pids": pool.pids()})
    return worker, pool


async def until_stopped() -> None:
    """Until SIGTERM (an orchestrator's stop) or Ctrl+C."""
    stop = asyncio.Event()
    on_stop_signals(lambda _: stop.set())
    await stop.wait()


def run_process(main: Coroutine[Any, Any, None]) -> int:
    """Run a server process; what stops it at start is one line on stderr and exit code 2."""
    fix_mmap_threshold()
    size_datagram_reads()
    try:
        asyncio.run(main)
    except SceneError as exc:
        print(f"render-server: cannot load the scene: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ListenError, ConnectionError, ValueError, ChildStartError) as exc:
        # a backend that cannot run, a taken port, an unreachable Redis, a bad key
        print(f"render-server: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


async def build_app(
    config: ServerConfig, scene: Scene | None = None, backends: Backends | None = None
) -> web.Application:
    """A signaling replica as an aiohttp app, with `serve`'s embedded worker if configured.

    BackendUnavailable (a ConfigError) when `cuda` or `nvenc` was asked for and cannot run.
    """
    metrics = Metrics()
    worker, pool = None, None
    # the upload folder first: the embedded worker reads it, checking tickets with its key
    scenes = open_scene_service(
        config, Authenticator(load_keys(config.secret, config.key_file), config.auth_required)
    )
    if config.embedded_worker:  # first: a scene or backend that cannot work stops the start
        worker_id = f"local-{socket.gethostname()}"
        source = None
        if scenes is not None:
            source = SceneSource(folder=scenes.store.root, ticket_key=scenes.ticket_key)
        worker, pool = await start_worker(worker_id, config, metrics, scene, backends, source)
    ctx = await connect_context(config, metrics)
    app = create_app(ctx, scenes)
    if worker is not None:
        link = LocalWorkerLink(ctx)  # the worker reaches this replica in process, not by socket
        embedded = EmbeddedWorker(
            link, worker, config.heartbeat_s, config.labels, config.region, pool=pool
        )
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
    tls = None
    if config.tls_cert is not None and config.tls_key is not None:  # before anything starts
        tls = server_context(config.tls_cert, config.tls_key)
    app = await build_app(config)
    settle_heap()
    watch_event_loop()  # warmed up: from now on a late timer is a stream's wait (loop_lag.py)
    limits = ConnectionLimits.of(config)
    runner = web.AppRunner(
        app, access_log=None, shutdown_timeout=2.0, keepalive_timeout=limits.keepalive_timeout_s
    )
    await runner.setup()
    try:
        # not a TCPSite: the connections are counted and timed (signaling/connection_limits.py)
        listener = await listen(
            runner, config.host, config.port, limits, app[CONTEXT_KEY].metrics, tls=tls
        )
    except OSError as exc:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {config.host}:{config.port}: {exc}") from exc
    host = f"[{config.host}]" if ":" in config.host else config.host
    what = "streaming" if config.embedded_worker else "signaling"
    auth = "on" if config.auth_required else "off"
    scheme = "http" if tls is None else "https"
    print(f"render-server: {what} at {scheme}://{host}:{config.port}/  (auth {auth}; "
          "Ctrl+C to stop)", flush=True)  # fmt: skip
    try:
        await until_stopped()
    finally:
        listener.close()  # no new connections; cleanup closes the open ones
        await runner.cleanup()


async def run_worker(config: WorkerConfig) -> None:
    worker_id = config.worker_id or default_id("worker")
    token = config.token
    if token is None and (config.secret or config.key_file):
        keys = load_keys(config.secret, config.key_file)
        token = Authenticator(keys).mint("worker", worker_id, SELF_MINTED_TOKEN_TTL_S)
    # uploaded scenes come from the first signaling URL: every replica shares the scene folder
    source = SceneSource(url=signaling_http_url(config.signaling_urls[0]), token=token)
    worker, pool = await start_worker(worker_id, config, Metrics(), scene_source=source)
    settle_heap()
    watch_event_loop()  # warmed up: from now on a late timer is a stream's wait (loop_lag.py)
    agent = WorkerAgent(
        worker, config.signaling_urls, token, config.heartbeat_s, config.labels, config.region,
        drain_timeout_s=config.drain_timeout_s, pool=pool,
    )  # fmt: skip
    print(f"render-server: worker {worker_id} serving {config.slots} slots for "
          f"{', '.join(config.signaling_urls)}", flush=True)  # fmt: skip
    # the first SIGTERM/SIGINT drains (sessions handed over), a second one leaves at once
    await serve_worker(agent, config)
