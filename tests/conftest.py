"""Fixtures that start the real server (aiohttp on a free port) with a small stream."""

from __future__ import annotations

import concurrent.futures.thread
import dataclasses
import os
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from render_server.config import Resolution, ServerConfig, StreamConfig
from render_server.metrics import Metrics
from render_server.render import Scene, default_scene
from render_server.stream.session import StreamSession
from render_server.thread_policy import demote_realtime_threads

from .leftover_processes import mark_this_run, stop_leftovers
from .redis_server import redis_server
from .support import ServerFactory

pytest_plugins = ["tests.hang_watch"]

mark_this_run()  # before any test starts a process, so that every child inherits the mark

OUTPUT_DIR = Path(os.environ.get("TEST_OUTPUT_DIR", Path(__file__).parent.parent / "test-output"))

SMALL_STREAM = StreamConfig(resolution=Resolution(320, 240), fps=30.0)


# Modules whose tests hold a real stream to a frame rate, a latency or a gap bound (the network
# lab, the load-test harness, the latency meters, a fleet or a shared session under faults).
# Marked `serial`: the README's command runs the rest on three pytest-xdist workers, then these
# alone, where no other test takes the cores they are measured on (side by side, a lossy-link
# stream in Chromium fell from 29.9 to 18.4 fps drawn). The other browser tests check what the
# page does, with bounds loose enough to hold beside two other tests.
SERIAL_MODULES = frozenset({
    "test_netlab", "test_firefox_lab", "test_congestion_lab", "test_turn_lab",
    "test_loadtest", "test_loadtest_receiver", "test_loadtest_decode", "test_loadtest_verdict",
    "test_latency_browser", "test_latency_cli", "test_first_move_meter",
    "test_first_move_render", "test_track_first_move", "test_benchmark_sharing",
    "test_fleet", "test_hostile", "test_sharing_browser", "test_firefox_stream", "test_browser",
    "test_codec_browsers",
})  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a renamed or misspelt module would otherwise leave the list, and run beside others, unseen
    missing = SERIAL_MODULES - {path.stem for path in Path(__file__).parent.glob("test_*.py")}
    if missing:
        raise pytest.UsageError(f"SERIAL_MODULES names no such test module: {sorted(missing)}")
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """End what the run left running (it would hold CI's output pipe open) and say what it was;
    name the threads the interpreter's exit will wait for (hang_watch bounds that wait)."""
    lines = []
    stopped = stop_leftovers()
    if stopped:
        lines += [f"stopped {len(stopped)} process(es) the tests left running:", *stopped]
    waited = [t.name for t in threading.enumerate() if _exit_waits_for(t)]
    if waited:
        lines.append(f"threads the interpreter's exit waits for: {', '.join(waited)}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if lines and reporter is not None:
        reporter.ensure_newline()
        reporter.write_line("\n".join(lines))


def _exit_waits_for(thread: threading.Thread) -> bool:
    # an idle executor's worker ends when its executor shuts down at exit: not a wait
    idle_worker = getattr(thread, "_target", None) is concurrent.futures.thread._worker
    return not thread.daemon and thread is not threading.main_thread() and not idle_worker


@pytest.fixture(autouse=True)
def _no_real_time_threads() -> Iterator[None]:
    """A test that opens SVT-AV1 itself (not through our encoders) as root leaves its thread
    SCHED_FIFO 99, and every process the run starts afterwards (servers, browsers) would
    inherit it: one that spins then starves the machine (thread_policy.py)."""
    yield
    demote_realtime_threads()


@pytest.fixture(scope="session")
def scene() -> Scene:
    return default_scene()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """One real redis-server for the whole run; each test keeps to keys and channels of its own
    (`redis_server.fresh_prefix`)."""
    with redis_server() as url:
        yield url


@pytest.fixture
def output_dir() -> Path:
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUTPUT_DIR


@pytest.fixture
def server_config() -> ServerConfig:
    return ServerConfig(port=0, stream=SMALL_STREAM, slots=2)


@pytest.fixture
def start_server(aiohttp_server, scene: Scene) -> ServerFactory:  # type: ignore[no-untyped-def]
    """Start the one-process server; keyword arguments override ServerConfig fields."""
    from render_server.cli.process import build_app

    async def start(**overrides: object) -> TestServer:
        config = dataclasses.replace(
            ServerConfig(port=0, stream=SMALL_STREAM, slots=2), **overrides
        )
        app: web.Application = await build_app(config, scene)
        return await aiohttp_server(app, host="127.0.0.1")  # type: ignore[no-any-return]

    return start


@pytest.fixture
async def worker_session(scene: Scene) -> AsyncIterator[StreamSession]:
    """A session opened on a one-slot `LocalWorker` (160x90, libx264, CPU renderer), for a
    real aiortc peer to offer to; closed after the test."""
    from render_server.worker.local import LocalWorker

    stream = StreamConfig(resolution=Resolution(160, 90), encoder="x264", renderer="cpu")
    worker = LocalWorker("w", scene, stream, 1, Metrics())

    async def on_end(reason: str) -> None:
        pass

    opened = await worker.open_session("b" * 32, on_end)
    yield opened
    await opened.close("test_done")
