"""A size the worker cannot build: the stream goes on at its old size and the page is told."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiortc import RTCPeerConnection, RTCSessionDescription

from render_server.config import Resolution, StreamConfig
from render_server.encode.protocol import Encoder
from render_server.metrics import Metrics
from render_server.render.scene import Scene
from render_server.stream.pictures import PictureSource
from render_server.worker.local import LocalWorker


class OutOfEncoders(LocalWorker):
    """A worker whose encoders run out at one size, as a consumer GPU's NVENC sessions do."""

    def build_stages(
        self, resolution: Resolution, fps: float, scene: Scene | None, codec: str = "H264"
    ) -> tuple[PictureSource, Encoder]:
        if resolution == Resolution(640, 360):
            raise RuntimeError("no NVENC session free")
        return super().build_stages(resolution, fps, scene, codec)


async def test_a_size_that_cannot_be_built_is_reported_with_the_size_that_stays(
    scene: Scene,
) -> None:
    stream = StreamConfig(resolution=Resolution(320, 240), encoder="x264", renderer="cpu")
    worker = OutOfEncoders("w", scene, stream, 1, Metrics())
    ended: list[str] = []

    async def on_end(reason: str) -> None:
        ended.append(reason)

    session = await worker.open_session("a" * 32, on_end)
    browser = RTCPeerConnection()
    messages: list[dict[str, Any]] = []
    arrived = asyncio.Event()
    try:
        browser.addTransceiver("video", direction="recvonly")
        channel = browser.createDataChannel("input")
        opened = asyncio.Event()
        channel.on("open", opened.set)

        def on_message(data: str) -> None:
            messages.append(json.loads(data))
            arrived.set()

        channel.on("message", on_message)
        await browser.setLocalDescription(await browser.createOffer())
        answer = await session.accept_offer(browser.localDescription.sdp)
        await browser.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(opened.wait(), 20)
        channel.send(json.dumps({"type": "quality", "width": 640, "height": 360}))

        async def failure() -> dict[str, Any]:
            while True:
                for message in messages:
                    if message.get("error") == "format_failed":
                        return message
                arrived.clear()
                await arrived.wait()

        reported = await asyncio.wait_for(failure(), 20)
        assert (reported["type"], reported["width"], reported["height"]) == ("quality", 320, 240)
        replies = [m for m in messages if m.get("type") == "quality"]
        assert (replies[1]["width"], replies[1]["height"]) == (640, 360)  # asked, then refused
        assert session.quality.resolution == Resolution(320, 240)
        frames = session.frames
        await asyncio.sleep(0.5)
        assert session.frames > frames, "the stream stopped"
    finally:
        await browser.close()
        await session.close("test_done")
    assert ended == ["test_done"]
