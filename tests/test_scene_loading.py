"""A worker's side of uploads (stream/scene_fetch.py, scene_loading.py): the file fetched from a
real signaling replica or read from its folder, the ticket checked, the scene swapped in off the
frame path, failures told to the page, and a moved session's upload carried along."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from render_server.metrics import Metrics
from render_server.protocol.data_channel import CommandError, SceneCommand
from render_server.protocol.scenes import TicketError, mint_ticket
from render_server.render.builtin_scenes import default_scene
from render_server.render.camera import OrbitCamera
from render_server.render.scene import Scene
from render_server.render.scene_files import SceneLimits
from render_server.scene_formats.errors import SceneError
from render_server.stream.controls import CameraController
from render_server.stream.scene_commands import SceneCommands
from render_server.stream.scene_fetch import SceneFetcher, SceneSource, SceneUnavailable
from render_server.stream.scene_loading import SceneLoading
from render_server.stream.state import export_state, read_state

from .processes import token
from .support import eventually_async
from .test_scene_upload import GLB, Start, service_of, start, upload

__all__ = ["start"]  # the fixture, shared with test_scene_upload

pytestmark = pytest.mark.asyncio
LIMITS = SceneLimits(max_triangles=100_000, max_bytes=400_000)


async def stored(start: Start) -> tuple[TestServer, str, str]:
    server = await start()
    async with aiohttp.ClientSession() as http:
        status, body = await upload(http, server, GLB, subject="dana")
    assert status == 201, body
    return server, body["id"], body["ticket"]


def url_source(server: TestServer) -> SceneSource:
    return SceneSource(url=str(server.make_url("/")), token=token("worker", "w1"))


async def test_a_worker_loads_an_upload_over_http_and_from_the_folder(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    service = service_of(server)
    folder = SceneSource(folder=service.store.root, ticket_key=service.ticket_key)
    for source in (url_source(server), folder):
        scene = await SceneFetcher(source, LIMITS).fetch(scene_id, ticket)
        assert scene.triangle_count == 5120  # the icosphere of subdivision 4: 20 × 4⁴


async def test_tickets_and_limits_hold_on_both_sources(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    service = service_of(server)
    folder = SceneSource(folder=service.store.root, ticket_key=service.ticket_key)
    eve = mint_ticket(service.ticket_key, scene_id, "eve")  # signed, but not the owner's
    forged = mint_ticket(b"k" * 32, scene_id, "dana")
    for source in (url_source(server), folder):
        fetcher = SceneFetcher(source, LIMITS)
        for bad, code in ((eve, "forbidden"), (forged, "unauthorized"), ("", "unauthorized")):
            with pytest.raises(TicketError) as refused:
                await fetcher.fetch(scene_id, bad)
            assert refused.value.code == code, (source, bad, refused.value)
        small = SceneFetcher(source, SceneLimits(max_triangles=100, max_bytes=400_000))
        with pytest.raises(SceneError, match="5120 triangles, over the limit of 100"):
            await small.fetch(scene_id, ticket)
    tiny = SceneFetcher(url_source(server), SceneLimits(max_bytes=1000))
    with pytest.raises(SceneError, match="over this worker's limit of 1000 bytes"):
        await tiny.fetch(scene_id, ticket)


async def test_a_signaling_out_of_reach_is_unavailable(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    source = url_source(server)
    await server.close()
    with pytest.raises(SceneUnavailable):
        await SceneFetcher(source, LIMITS).fetch(scene_id, ticket)


class Session:
    """A session's commands and its loader, with the messages and scenes it produced."""

    def __init__(self, fetcher: SceneFetcher) -> None:
        base = default_scene()
        self.shown: list[Scene] = []
        self.sent: list[dict[str, Any]] = []
        camera = OrbitCamera.framed_on(base.bounds_min, base.bounds_max)
        self.commands = SceneCommands(
            base, CameraController(camera), lambda build: self.shown.append(build())
        )
        self.metrics = Metrics()
        self.loading = SceneLoading(
            fetcher, self.commands.replace_base, self.sent.append, self.metrics
        )
        self.commands.loader = self.loading.start

    def run(self, name: str, args: dict[str, Any], role: str = "controller") -> Any:
        return self.commands.run(SceneCommand(name, args, 1), role)

    async def outcome(self) -> dict[str, Any]:
        await eventually_async(lambda: any(m["type"] == "scene" for m in self.sent), timeout=30)
        return next(m for m in self.sent if m["type"] == "scene")


async def test_load_scene_swaps_the_scene_and_frames_the_camera(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    session = Session(SceneFetcher(url_source(server), LIMITS))
    session.run("setMaterial", {"material": "glossy_red", "color": "#00ff00"})
    camera_before = session.commands.controller.camera.copy()
    answer = session.run("loadScene", {"scene": scene_id, "ticket": ticket})
    assert answer == {"scene": scene_id, "status": "loading"}
    assert session.commands.base.triangle_count != 5120  # the old scene streams meanwhile
    message = await session.outcome()
    assert message == {"type": "scene", "scene": scene_id, "status": "loaded",
                       "triangles": 5120, "objects": 1}  # fmt: skip
    assert session.shown[-1].triangle_count == 5120
    assert session.commands.edits.materials == {}  # the old scene's edits are gone
    camera = session.commands.controller.camera
    assert camera.distance != camera_before.distance  # framed on a ball of radius 1
    assert session.loading.upload == {"scene": scene_id, "ticket": ticket}
    assert session.metrics.scene_loads.labels("loaded")._value.get() == 1
    # a moved session takes its upload along
    state = read_state(
        export_state(camera, _quality(), session.commands.edits, session.commands.base,
                     session.loading.upload),
        default_scene(),
    )  # fmt: skip
    assert state.upload == {"scene": scene_id, "ticket": ticket}


async def test_refusals_reach_the_page_and_the_scene_stays(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    session = Session(SceneFetcher(url_source(server), LIMITS))
    service = service_of(server)
    eve = mint_ticket(service.ticket_key, scene_id, "eve")
    session.run("loadScene", {"scene": scene_id, "ticket": eve})
    message = await session.outcome()
    assert (message["status"], message["code"]) == ("failed", "forbidden"), message
    assert session.shown == [] and session.loading.upload is None
    assert session.metrics.scene_loads.labels("refused")._value.get() == 1
    for args in ({"scene": "nope", "ticket": ticket}, {"scene": scene_id},
                 {"scene": scene_id, "ticket": ticket, "extra": 1}):  # fmt: skip
        with pytest.raises(CommandError, match="bad_command|scene|ticket|argument"):
            session.run("loadScene", args)
    with pytest.raises(CommandError) as refused:
        session.run("loadScene", {"scene": scene_id, "ticket": ticket}, role="viewer")
    assert refused.value.code == "forbidden"
    session.commands.loader = None
    with pytest.raises(CommandError) as refused:
        session.run("loadScene", {"scene": scene_id, "ticket": ticket})
    assert refused.value.code == "unavailable"


async def test_only_the_newest_load_counts(start: Start) -> None:
    server, scene_id, ticket = await stored(start)
    session = Session(SceneFetcher(url_source(server), LIMITS))
    session.run("loadScene", {"scene": scene_id, "ticket": ticket})
    session.run("loadScene", {"scene": scene_id, "ticket": ticket})  # cancels the first
    await session.outcome()
    await asyncio.sleep(0.5)
    assert len(session.shown) == 1 and len([m for m in session.sent if m["type"] == "scene"]) == 1


def _quality() -> Any:
    from render_server.config import StreamConfig
    from render_server.stream.quality import QualityLimits

    stream = StreamConfig()
    return QualityLimits.of(stream).initial(stream)
