"""A frame pipeline that fails is said, not hidden: rebuilt once, and the session ended (with
`worker_failed`, which reaches the browser) when it fails again soon after."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import av
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from render_server.config import Resolution, StreamConfig
from render_server.encode.protocol import EncodedPacket, Encoder
from render_server.metrics import Metrics
from render_server.render.camera import OrbitCamera
from render_server.render.scene import Scene
from render_server.stream.pictures import PictureSource
from render_server.stream.session import StreamSession
from render_server.transport.track import EncodedVideoTrack
from render_server.worker.agent import WorkerAgent
from render_server.worker.local import LocalWorker

from .fake_signaling import FakeSignaling, sid, until
from .test_worker_failover import running

STREAM = StreamConfig(resolution=Resolution(64, 64), fps=20.0, renderer="cpu", encoder="x264")


class FlakyEncoder:
    """An encoder that fails while its worker says so (a GPU that fell off the bus)."""

    def __init__(self, inner: Encoder, worker: FlakyWorker) -> None:
        self.inner = inner
        self.worker = worker

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def encode(self, frame: av.VideoFrame, pts: int, keyframe: bool = False) -> Any:
        if self.worker.failing:
            self.worker.failing -= 1 if self.worker.failing > 0 else 0
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.inner.encode(frame, pts, keyframe)

    def close(self) -> None:
        self.inner.close()


class FlakyWorker(LocalWorker):
    failing = 0  # encodes still to fail; -1: all of them

    def build_stages(
        self, resolution: Resolution, fps: float, scene: Scene | None, codec: str = "H264"
    ) -> tuple[PictureSource, Encoder]:
        pictures, encoder = super().build_stages(resolution, fps, scene, codec)
        self.built = getattr(self, "built", 0) + 1
        return pictures, FlakyEncoder(encoder, self)  # type: ignore[return-value]


# -- the track -----------------------------------------------------------------------------------


class Source:
    """A FrameSource whose first `fail` frames raise."""

    cheap = True

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls = 0

    def is_still(self, camera: object) -> bool:
        return False

    def produce(self, camera: object, pts: int) -> EncodedPacket | None:
        self.calls += 1
        if self.calls <= self.fail:
            raise RuntimeError("encoder exploded")
        return av.Packet(b"\x00\x00\x00\x01\x65")


async def test_the_track_asks_whether_to_go_on_after_a_failed_frame() -> None:
    errors: list[Exception] = []

    def go_on(exc: Exception) -> bool:
        errors.append(exc)
        return True

    with ThreadPoolExecutor(1) as executor:
        source = Source(fail=1)
        track = EncodedVideoTrack(source, 50.0, lambda dt: None, executor, on_error=go_on)
        packet = await asyncio.wait_for(track.recv(), 5)
        assert packet is not None and source.calls == 2 and len(errors) == 1

        stopping = EncodedVideoTrack(Source(fail=1), 50.0, lambda dt: None, executor,
                                     on_error=lambda exc: False)  # fmt: skip
        with pytest.raises(MediaStreamError):
            await asyncio.wait_for(stopping.recv(), 5)
        assert stopping.readyState == "ended"


def test_a_rebuild_replaces_the_stages_and_starts_from_a_keyframe(scene: Scene) -> None:
    worker = FlakyWorker("w", scene, STREAM, 1, Metrics())
    pipeline = worker._pipeline()
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    assert pipeline.produce(camera, 0) is not None
    broken = pipeline.encoder
    worker.failing = 1
    with pytest.raises(RuntimeError):
        pipeline.produce(camera, 3000)
    pipeline.request_rebuild()
    packet = pipeline.produce(camera, 6000)
    assert pipeline.encoder is not broken and pipeline.rebuilds == 1
    assert packet is not None and pipeline.last.keyframe
    assert (pipeline.encoder.width, pipeline.encoder.height) == (64, 64)
    pipeline.close()


# -- a session with a real peer ------------------------------------------------------------------


async def connect(session: StreamSession | None, pc: RTCPeerConnection, answer: Any) -> None:
    pc.addTransceiver("video", direction="recvonly")
    pc.createDataChannel("input")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = await answer(pc.localDescription.sdp)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))


@pytest.fixture
async def browser() -> AsyncIterator[RTCPeerConnection]:
    pc = RTCPeerConnection()
    yield pc
    await pc.close()


async def test_one_failure_rebuilds_the_pipeline_and_the_stream_goes_on(
    scene: Scene, browser: RTCPeerConnection, caplog: pytest.LogCaptureFixture
) -> None:
    worker = FlakyWorker("w", scene, STREAM, 1, Metrics())
    ended: list[str] = []

    async def on_end(reason: str) -> None:
        ended.append(reason)

    session = await worker.open_session(sid(1), on_end)
    try:
        await connect(session, browser, session.accept_offer)
        await until(lambda: session.frames >= 3, what="frames before the failure")
        with caplog.at_level(logging.ERROR):
            worker.failing = 1
            await until(lambda: session.pipeline.rebuilds == 1, what="a rebuild")
            frames = session.frames
            await until(lambda: session.frames >= frames + 3, what="frames after the rebuild")
        failed = [r for r in caplog.records if r.getMessage() == "session.frame_failed"]
        assert len(failed) == 1 and failed[0].exc_info is not None  # with its traceback
        assert not ended
    finally:
        await session.close("test_done")
    assert ended == ["test_done"]


async def test_a_second_failure_ends_the_session_and_signaling_is_told(
    scene: Scene, browser: RTCPeerConnection, caplog: pytest.LogCaptureFixture
) -> None:
    worker = FlakyWorker("w", scene, STREAM, 1, Metrics())
    fake = await FakeSignaling().start()
    try:
        agent = WorkerAgent(worker, fake.url, None)
        async with running(agent):
            await until(agent.registered.is_set)
            await fake.send({"type": "session.open", "sessionId": sid(2)})
            await fake.wait_for("session.opened", sessionId=sid(2))

            async def answer(offer: str) -> str:
                await fake.send({"type": "offer", "sessionId": sid(2), "sdp": offer})
                return str((await fake.wait_for("answer", sessionId=sid(2)))[0]["sdp"])

            await connect(None, browser, answer)
            session = agent.service.sessions[sid(2)]
            await until(lambda: session.frames >= 3, what="frames before the failure")
            with caplog.at_level(logging.ERROR):
                worker.failing = -1  # the rebuilt encoder fails too
                ended = await fake.wait_for("session.ended", sessionId=sid(2))
            assert ended[0]["reason"] == "worker_failed"
            failed = [r for r in caplog.records if r.getMessage() == "session.pipeline_failed"]
            assert len(failed) == 1 and failed[0].exc_info is not None
            assert session.pipeline.rebuilds == 1
            assert worker.metrics.pipeline_failures._value.get() == 2
    finally:
        await fake.stop()
