"""A worker that cannot keep up lowers a session's frame rate, says so, and shows it in /metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from render_server.config import Resolution, StreamConfig
from render_server.tools.viewer import Viewer
from render_server.worker.local import LocalWorker

from .slow_stages import slowed
from .support import ServerFactory, ws_url


async def metrics_text(server: TestServer) -> str:
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as response:
        return await response.text()


def samples(text: str, name: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    ]


async def session_cpu_seconds(server: TestServer, timeout: float = 10.0) -> float:
    """The session's CPU gauge once it counts: /proc keeps CPU time in 10 ms ticks, and the
    frames of a still 160x120 picture take well under a millisecond each to encode."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        (cpu,) = samples(await metrics_text(server), "worker_session_cpu_seconds{")
        if cpu > 0 or asyncio.get_running_loop().time() > deadline:
            return cpu
        await asyncio.sleep(0.2)


async def test_an_overloaded_session_sends_fewer_frames_instead_of_later_ones(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every frame takes 60 ms more than it should (its encoder sleeps; the camera stands still,
    # so a picture is drawn once and only encoding runs on every frame): 30 fps cannot hold
    monkeypatch.setattr(
        LocalWorker, "build_stages", slowed(LocalWorker.build_stages, encode_s=0.06)
    )
    stream = StreamConfig(resolution=Resolution(160, 120), fps=30.0, idle_fps=30.0)
    server = await start_server(stream=stream)
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        message = await viewer.wait_message("quality", overloaded=True, timeout=15)
        assert message["fps"] < 30
        assert await session_cpu_seconds(server) > 0
        text = await metrics_text(server)
        assert samples(text, "worker_overload_steps_total")[0] >= 1
        assert 0 < samples(text, "worker_session_fps{")[0] < 30
        assert samples(text, "worker_session_dropped_ticks{")[0] > 0
        assert len(samples(text, "worker_session_send_ms{")) == 1
    text = await metrics_text(server)
    for name in ("worker_session_fps{", "worker_session_cpu_seconds{"):
        assert samples(text, name) == [], f"{name} outlives its session"
