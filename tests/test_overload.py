"""A worker that cannot keep up lowers a session's frame rate, says so, and shows it in /metrics."""

from __future__ import annotations

import aiohttp

from render_server.config import Resolution, StreamConfig
from render_server.tools.viewer import Viewer

from .support import ServerFactory, ws_url


async def metrics_text(server) -> str:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as response:
        return await response.text()


def samples(text: str, name: str) -> list[float]:
    return [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and not line.startswith("#")
    ]


async def test_an_overloaded_session_sends_fewer_frames_instead_of_later_ones(
    start_server: ServerFactory,
) -> None:
    # every frame takes 60 ms more than it should: a 30 fps stream cannot hold
    stream = StreamConfig(
        resolution=Resolution(160, 120), fps=30.0, idle_fps=30.0,
        debug_delays_ms=(("render", 60.0),),
    )  # fmt: skip
    server = await start_server(stream=stream)
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        message = await viewer.wait_message("quality", overloaded=True, timeout=15)
        assert message["fps"] < 30
        text = await metrics_text(server)
        assert samples(text, "worker_overload_steps_total")[0] >= 1
        assert 0 < samples(text, "worker_session_fps{")[0] < 30
        assert samples(text, "worker_session_cpu_seconds{")[0] > 0
        assert samples(text, "worker_session_dropped_ticks{")[0] > 0
        assert len(samples(text, "worker_session_send_ms{")) == 1
    text = await metrics_text(server)
    for name in ("worker_session_fps{", "worker_session_cpu_seconds{"):
        assert samples(text, name) == [], f"{name} outlives its session"
