"""The unordered `moves` channel (docs/data-channel.md): a real aiortc peer opens `input` and an
unordered `moves` channel on a worker's session; moves and wheel turns on `moves` steer the
camera, an older move arriving late moves it without taking the latency records' `seq` back,
anything else on `moves` is refused `wrong_channel` (answered on `input`, counted, changing
nothing), and a second `moves` channel (or one of another label) is closed. Over a lossy path
this is what keeps a drag going (`benchmarks/network.py`: no frame sent for 100-200 ms while a
lost packet held the ordered channel); Chromium's SDK using it is in test_browser_client.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from render_server.stream.session import StreamSession

from .support import eventually_async

pytestmark = pytest.mark.asyncio


def move(seq: int, dx: float = 0.05) -> dict[str, Any]:
    return {"type": "pointer", "action": "move", "x": 0.5, "y": 0.5, "dx": dx, "dy": 0.0,
            "buttons": 1, "seq": seq}  # fmt: skip


class Page:
    """A page as the SDK opens its peer: `input` (ordered) and `moves` (unordered)."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTransceiver("video", direction="recvonly")
        self.input = self.pc.createDataChannel("input")
        self.moves = self.pc.createDataChannel("moves", ordered=False)
        self.messages: list[dict[str, Any]] = []
        self.input.on("message", lambda data: self.messages.append(json.loads(data)))

    async def connect(self, session: StreamSession) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        answer = await session.accept_offer(self.pc.localDescription.sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await eventually_async(
            lambda: self.input.readyState == self.moves.readyState == "open", 20, what="open"
        )

    async def error(self, code: str) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((m for m in self.messages if m.get("code") == code), None)

        result: dict[str, Any] = await eventually_async(found, 10, what=f"a {code} error")
        return result


@pytest.fixture
async def page(worker_session: StreamSession) -> AsyncIterator[Page]:
    page = Page()
    await page.connect(worker_session)
    yield page
    await page.pc.close()


def rejected(worker_session: StreamSession, code: str) -> float:
    value = worker_session.metrics.registry.get_sample_value(
        "worker_input_rejected_total", {"code": code}
    )
    return value or 0.0


async def test_moves_on_the_unordered_channel_steer_the_camera(
    worker_session: StreamSession, page: Page
) -> None:
    held = worker_session.input.moves
    assert held is not None and held.ordered is False  # the worker sees it unordered
    camera = worker_session.input.controller.camera
    yaw = camera.yaw
    for seq in range(1, 6):
        page.moves.send(json.dumps(move(seq)))
    await eventually_async(lambda: abs(camera.yaw - yaw) > 0.1, 10, what="the drag's orbit")
    turned = camera.yaw
    # an older move, late: the camera moves by it, the newest input stays the newest
    newest = worker_session.input.newest_input_seq
    assert newest == 5
    page.moves.send(json.dumps(move(3)))
    await eventually_async(lambda: camera.yaw != turned, 10, what="the late move's orbit")
    assert worker_session.input.newest_input_seq == 5
    # a wheel turn goes there too
    distance = camera.distance
    page.moves.send(json.dumps({"type": "wheel", "dy": 120, "seq": 6}))
    await eventually_async(lambda: camera.distance != distance, 10, what="the zoom")
    assert worker_session.input.newest_input_seq == 6
    assert not [m for m in page.messages if m.get("type") == "error"]


async def test_only_moves_go_on_the_moves_channel(
    worker_session: StreamSession, page: Page
) -> None:
    camera = worker_session.input.controller.camera
    state = camera.state()
    before = rejected(worker_session, "wrong_channel")
    page.moves.send(json.dumps({"type": "key", "action": "down", "code": "KeyW", "seq": 1}))
    error = await page.error("wrong_channel")
    assert "`key`" in error["message"] and "`input`" in error["message"]
    page.moves.send(json.dumps({**move(2), "action": "down"}))  # a press is not a move
    page.moves.send(json.dumps({"type": "ping", "id": 1, "t": 0}))
    await eventually_async(
        lambda: rejected(worker_session, "wrong_channel") == before + 3, 10, what="three refused"
    )
    await asyncio.sleep(0.3)  # a key held would have moved the camera by now
    assert camera.state() == state
    assert not [m for m in page.messages if m.get("type") == "pong"]
    # malformed input on it is refused as on `input`
    page.moves.send("{not json")
    await page.error("bad_json")
    # ... and `input` still takes everything, moves included
    page.input.send(json.dumps(move(7)))
    await eventually_async(lambda: camera.state() != state, 10, what="a move on input")


async def test_a_second_moves_channel_is_closed(worker_session: StreamSession, page: Page) -> None:
    second = page.pc.createDataChannel("moves", ordered=False)
    other = page.pc.createDataChannel("files")  # no such channel: closed too
    await eventually_async(
        lambda: second.readyState == other.readyState == "closed", 10, what="refused"
    )
    assert page.moves.readyState == "open"
    camera = worker_session.input.controller.camera
    yaw = camera.yaw
    page.moves.send(json.dumps(move(1)))
    await eventually_async(lambda: camera.yaw != yaw, 10, what="the first one still steers")
