"""A real aiortc peer through real signaling: frames, input, keyframe requests, teardown."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from render_server.tools.viewer import Viewer

from .conftest import SMALL_STREAM
from .support import ServerFactory, ws_url

pytestmark = pytest.mark.asyncio


def picture(frame) -> np.ndarray:  # type: ignore[no-untyped-def]
    return frame.to_ndarray(format="rgb24").astype(np.int16)


async def metric(server, name: str) -> float:  # type: ignore[no-untyped-def]
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_receives_decodable_frames_of_the_configured_size(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        assert viewer.session_info["codec"] == "H264"
        frames = [await viewer.next_frame(timeout=20) for _ in range(30)]
        assert all((f.width, f.height) == (320, 240) for f in frames)
        # the default scene is not a blank picture
        assert picture(frames[-1]).std() > 10
    assert await metric(server, "worker_frames_encoded_total") >= 30


async def test_a_drag_orbits_the_camera_and_the_picture_follows(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        before = picture(await viewer.latest_frame())
        still = picture(await viewer.latest_frame())
        assert np.abs(before - still).mean() < 1.0  # a still camera: the same picture
        await viewer.send_input(
            {"type": "pointer", "action": "down", "x": 0.5, "y": 0.5, "buttons": 1}
        )
        for _ in range(10):
            await viewer.send_input(
                {
                    "type": "pointer",
                    "action": "move",
                    "x": 0.5,
                    "y": 0.5,
                    "dx": 0.03,
                    "dy": 0.0,
                    "buttons": 1,
                }
            )
        after = picture(await viewer.latest_frame())
        assert np.abs(before - after).mean() > 5.0
    assert await metric(server, 'worker_input_events_total{type="pointer"}') == 11


async def test_keyframe_request_yields_an_idr(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        first = await viewer.next_frame(timeout=20)
        assert first.key_frame
        await asyncio.sleep(0.5)
        assert await metric(server, 'worker_keyframes_total{reason="request"}') == 0
        await viewer.request_keyframe()  # a real RTCP PLI over the wire
        keyframe_seen = False
        for _ in range(30):
            frame = await viewer.next_frame(timeout=5)
            keyframe_seen = keyframe_seen or bool(frame.key_frame)
        assert keyframe_seen
        assert await metric(server, 'worker_keyframes_total{reason="request"}') == 1


async def test_bad_input_is_answered_on_the_channel_and_the_stream_goes_on(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        await viewer.send_raw_input("not json")
        await viewer.send_input({"type": "pointer", "action": "move", "dx": 1e9, "buttons": 1})
        await viewer.send_input({"type": "self-destruct"})
        for _ in range(50):
            if len(viewer.errors) >= 3:
                break
            await asyncio.sleep(0.1)
        assert [e["code"] for e in viewer.errors] == ["bad_json", "bad_input", "unknown_type"]
        for _ in range(10):
            await viewer.next_frame(timeout=5)
    assert await metric(server, "worker_input_rejected_total") == 3


async def test_ending_a_session_frees_its_slot(start_server: ServerFactory) -> None:
    server = await start_server(slots=1)
    viewer = Viewer(ws_url(server))
    await viewer.start()
    await viewer.next_frame(timeout=20)
    assert await metric(server, "sessions_active") == 1
    await viewer.close()
    for _ in range(50):
        if await metric(server, "sessions_active") == 0:
            break
        await asyncio.sleep(0.1)
    assert await metric(server, "sessions_active") == 0
    async with Viewer(ws_url(server)) as again:
        await again.next_frame(timeout=20)


async def test_unusable_ice_candidates_are_refused_and_the_stream_goes_on(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        for bad in (
            {"candidate": "candidate:garbage", "sdpMid": "0"},
            {"candidate": "candidate:1 1 udp 1 127.0.0.1 9 typ host"},  # no sdpMid/index
        ):
            await viewer.signaling.send({"type": "ice", **bad})
        for _ in range(50):
            if len(viewer.errors) >= 2:
                break
            await asyncio.sleep(0.1)
        assert [e["code"] for e in viewer.errors] == ["bad_message", "bad_message"]
        assert all("ICE candidate" in e["message"] for e in viewer.errors)
        for _ in range(10):
            await viewer.next_frame(timeout=5)


async def wait_for_metric(server, name: str, predicate, timeout: float = 5.0) -> float:  # type: ignore[no-untyped-def]
    value = await metric(server, name)
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate(value) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
        value = await metric(server, name)
    return value


async def test_remb_sets_the_encoders_bitrate_within_a_frame_or_two(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    configured = SMALL_STREAM.target_bitrate
    async with Viewer(ws_url(server), receiver_estimates=False) as viewer:
        await viewer.next_frame(timeout=20)
        assert (
            await wait_for_metric(server, "worker_encoder_bitrate_bps", lambda v: v == configured)
            == configured
        )
        sent = asyncio.get_running_loop().time()
        await viewer.send_remb(400_000)
        # the REMB less its packets' headers and overhead (transport/wire_meter.py)
        applied = await wait_for_metric(
            server, "worker_encoder_bitrate_bps", lambda v: 0.8 * 400_000 <= v <= 400_000
        )
        waited = asyncio.get_running_loop().time() - sent
        assert 0.8 * 400_000 <= applied <= 400_000
        print(f"REMB to encoder bitrate: {waited * 1e3:.0f} ms")
        assert waited < 1.0, f"REMB took {waited:.3f}s to reach the encoder"
        await viewer.send_remb(10**9)  # an estimate above the configured bitrate: capped
        assert (
            await wait_for_metric(server, "worker_encoder_bitrate_bps", lambda v: v == configured)
            == configured
        )
    assert await metric(server, "worker_remb_total") == 2
    assert await metric(server, "worker_encoder_bitrate_bps") == 0  # sessions over


async def test_a_real_receivers_estimates_reach_the_encoder(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:  # aiortc's receiver estimates on its own
        for _ in range(60):
            await viewer.next_frame(timeout=5)
        assert await wait_for_metric(server, "worker_remb_total", lambda v: v > 0) > 0


async def test_quality_and_commands_over_the_data_channel(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        await viewer.next_frame(timeout=20)
        # on open, the worker tells the page the stream's figures and limits
        opened = await viewer.wait_message("quality")
        assert opened == {
            "type": "quality", "width": 320, "height": 240, "fps": 30,
            "maxKbps": SMALL_STREAM.target_bitrate // 1000, "maxWidth": 3840, "maxHeight": 2160,
        }  # fmt: skip
        start = len(viewer.messages)
        await viewer.send_input({"type": "quality", "width": 201, "height": 121, "maxKbps": 600})
        applied = await viewer.wait_message("quality", start)
        assert (applied["width"], applied["height"], applied["maxKbps"]) == (200, 120, 600)
        sizes = set()
        for _ in range(100):
            frame = await viewer.next_frame(timeout=5)
            sizes.add((frame.width, frame.height))
            if (frame.width, frame.height) == (200, 120):
                break
        assert (200, 120) in sizes
        for _ in range(10):  # and it stays there
            frame = await viewer.next_frame(timeout=5)
            assert (frame.width, frame.height) == (200, 120)
        await wait_for_metric(server, "worker_encoder_bitrate_bps", lambda v: v == 600_000)
        assert await metric(server, "worker_encoder_bitrate_bps") == 600_000

        await viewer.send_input({"type": "command", "id": 1, "name": "getCamera"})
        camera = await viewer.wait_message("result", start, id=1)
        assert camera["name"] == "getCamera" and len(camera["value"]["target"]) == 3
        before = picture(await viewer.latest_frame())
        await viewer.send_input(
            {"type": "command", "id": 2, "name": "setTimeOfDay", "args": {"hours": 0}}
        )
        assert (await viewer.wait_message("result", start, id=2))["value"] == {"timeOfDay": 0}
        after = picture(await viewer.latest_frame())
        assert np.abs(before - after).mean() > 5  # night fell in this session
        await viewer.send_input({"type": "command", "id": 3, "name": "fly"})
        error = await viewer.wait_message("error", start, id=3)
        assert error["code"] == "unknown_command"
        await viewer.send_input({"type": "keyframe"})
        for _ in range(5):
            await viewer.next_frame(timeout=5)
