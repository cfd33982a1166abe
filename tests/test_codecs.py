"""Codec choice: what a worker sends, which codec an offer settles on, the VP8 and AV1 encoders,
and the `codecs` requirement that keeps a browser away from workers that cannot serve it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from render_server.config import ConfigError, Resolution, StreamConfig
from render_server.encode import pyav_encoder
from render_server.encode.av1 import create_svtav1_encoder
from render_server.encode.codecs import CODECS, choose_codec, cpu_codecs, parse_codecs, sendable
from render_server.encode.pyav_encoder import PyavVideoEncoder
from render_server.encode.vp8 import create_vp8_encoder
from render_server.metrics import Metrics
from render_server.protocol.errors import ProtocolError
from render_server.protocol.requirements import Requirements, parse_requirements
from render_server.render.scene import Scene
from render_server.signaling.state.registry_types import WorkerInfo
from render_server.stream.quality import QualityLimits, macroblocks
from render_server.stream.session import SessionNegotiationError
from render_server.tools.local_server import local_server
from render_server.transport.video_sender import (
    codec_preferences,
    decoder_limits,
    offered_codecs,
)
from render_server.worker.local import LocalWorker

from .support import receive

ROOT = Path(__file__).resolve().parents[1]

DECODERS = {"H264": "h264", "VP8": "vp8", "AV1": "libdav1d"}


def test_codec_lists_are_parsed_checked_and_ordered() -> None:
    assert parse_codecs("vp8, H264,vp8") == ("VP8", "H264")
    with pytest.raises(ValueError, match="unknown codec 'VP9'"):
        parse_codecs("H264,VP9")
    with pytest.raises(ValueError, match="no codec"):
        parse_codecs(" , ")
    assert sendable(None, ["AV1", "H264"]) == ("H264", "AV1")  # the project's order
    assert sendable(("AV1", "VP8"), CODECS) == ("AV1", "VP8")  # the operator's order
    assert sendable(("AV1",), ["H264"]) == ()
    with pytest.raises(ConfigError):
        StreamConfig(codecs=())


def test_this_pyav_encodes_every_codec_on_the_cpu() -> None:
    """CI's PyAV wheel carries libx264, libvpx and SVT-AV1: a CPU worker sends all three."""
    assert cpu_codecs() == CODECS


def test_the_browsers_order_wins_among_what_the_worker_sends() -> None:
    assert choose_codec(["VP8", "VP9", "H264", "AV1"], ("H264", "VP8", "AV1")) == "VP8"
    assert choose_codec(["VP9", "AV1"], ("H264", "VP8", "AV1")) == "AV1"
    assert choose_codec(["VP9"], ("H264", "VP8")) is None


async def _offer(*codecs: str) -> str:
    """An aiortc peer's offer with only `codecs` in it, in that order."""
    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("video", direction="recvonly")
        transceiver.setCodecPreferences(codec_preferences(*codecs))
        await pc.setLocalDescription(await pc.createOffer())
        return str(pc.localDescription.sdp)
    finally:
        await pc.close()


async def test_an_offers_codecs_are_read_in_its_order() -> None:
    assert offered_codecs(await _offer("AV1", "VP8", "H264")) == ["AV1", "VP8", "H264"]
    assert offered_codecs(await _offer("VP8")) == ["VP8"]
    assert offered_codecs("v=0\r\nnot sdp") == []


def _frame(width: int, height: int, shift: int) -> av.VideoFrame:
    luma = (np.indices((height * 3 // 2, width)).sum(0) // 2 + shift) % 256
    return av.VideoFrame.from_ndarray(luma.astype(np.uint8), format="yuv420p")


def _decode(codec: str, packets: list[bytes]) -> list[av.VideoFrame]:
    decoder = av.CodecContext.create(DECODERS[codec], "r")
    frames = [f for data in packets for f in decoder.decode(av.Packet(data))]
    return frames + list(decoder.decode(None))  # dav1d holds frames back for its threads


@pytest.mark.parametrize("make", [create_vp8_encoder, create_svtav1_encoder])
def test_vp8_and_av1_encoders_give_keyframes_on_request_and_decode(make: Any) -> None:
    encoder: PyavVideoEncoder = make(Resolution(320, 180), 30.0, 1_000_000)
    packets = []
    keyframes = []
    for i in range(12):
        packet = encoder.encode(_frame(320, 180, 3 * i), i * 3000, keyframe=i in (0, 8))
        assert packet is not None, "a real-time encoder holds no frame back"
        assert packet.pts == i * 3000
        packets.append(bytes(packet))
        keyframes.append(packet.is_keyframe)
    assert [i for i, k in enumerate(keyframes) if k] == [0, 8]
    decoded = _decode(encoder.codec, packets)
    assert len(decoded) == 12 and (decoded[0].width, decoded[0].height) == (320, 180)
    # a decoder that joins at the requested keyframe decodes from there
    assert len(_decode(encoder.codec, packets[8:])) == 4
    encoder.close()


def test_a_new_bitrate_reopens_vp8_after_an_interval_with_a_keyframe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libvpx through FFmpeg ignores a bit rate changed between frames: the encoder is opened
    afresh at the new rate, only for a big enough change, and at most once per interval."""
    clock = [1000.0]
    monkeypatch.setattr(pyav_encoder.time, "monotonic", lambda: clock[0])
    encoder = create_vp8_encoder(Resolution(320, 180), 30.0, 2_000_000)
    assert encoder.encode(_frame(320, 180, 0), 0) is not None
    assert encoder.set_bitrate(1_900_000) == 2_000_000  # a small change: nothing to do
    assert encoder.set_bitrate(500_000) == 500_000
    assert encoder.bitrate == 500_000
    clock[0] += 0.5
    packet = encoder.encode(_frame(320, 180, 1), 3000)
    assert packet is not None and not packet.is_keyframe and encoder.reopens == 0  # too soon
    clock[0] += 2.0
    packet = encoder.encode(_frame(320, 180, 2), 6000)
    assert packet is not None and packet.is_keyframe and encoder.reopens == 1
    assert encoder.bitrate == 500_000
    assert encoder.set_bitrate(10_000_000) == 2_000_000  # never above the configured rate


def test_the_codecs_requirement_is_checked_and_matched() -> None:
    parsed = parse_requirements({"codecs": ["vp8", "AV1", "VP8"]})
    assert parsed.codecs == ("VP8", "AV1")
    for bad in ("VP8", ["H264"] * 17, [1], ["a b"]):
        with pytest.raises(ProtocolError, match="codecs"):
            parse_requirements({"codecs": bad})
    h264_only = WorkerInfo("w", 1, {"codecs": ["H264"]})
    assert not Requirements(codecs=("VP8", "AV1")).fits(h264_only)
    assert Requirements(codecs=("VP8", "H264")).fits(h264_only)
    assert Requirements().fits(h264_only)
    assert Requirements.from_dict(parsed.as_dict()) == parsed


# -- a session settles on its browser's codec -------------------------------------------------


async def _session(scene: Scene, codecs: tuple[str, ...] | None) -> tuple[Any, list[str]]:
    stream = StreamConfig(
        resolution=Resolution(160, 96), encoder="x264", renderer="cpu", codecs=codecs
    )
    worker = LocalWorker("w", scene, stream, 1, Metrics())
    ended: list[str] = []

    async def on_end(reason: str) -> None:
        ended.append(reason)

    return await worker.open_session("c" * 32, on_end), ended


@pytest.mark.parametrize("codec", ["VP8", "AV1", "H264"])
async def test_a_session_streams_the_codec_its_browser_offers_first(
    scene: Scene, codec: str
) -> None:
    session, _ = await _session(scene, None)
    browser = RTCPeerConnection()
    frames: list[av.VideoFrame] = []
    try:
        transceiver = browser.addTransceiver("video", direction="recvonly")
        others = [name for name in CODECS if name != codec]
        transceiver.setCodecPreferences(codec_preferences(codec, *others))
        await browser.setLocalDescription(await browser.createOffer())
        answer = await session.accept_offer(browser.localDescription.sdp)
        assert offered_codecs(answer) == [codec]  # the answer names the one codec it sends
        assert session.pipeline.codec == codec
        await browser.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        track = transceiver.receiver.track
        while len(frames) < 3:  # aiortc's own decoder of that codec takes the stream
            frames.append(await asyncio.wait_for(track.recv(), 20))
        assert (frames[-1].width, frames[-1].height) == (160, 96)
    finally:
        await browser.close()
        await session.close("test_done")


async def test_an_offer_without_a_codec_the_worker_sends_names_both_sides(scene: Scene) -> None:
    session, ended = await _session(scene, ("H264",))
    try:
        with pytest.raises(SessionNegotiationError) as refused:
            await session.accept_offer(await _offer("VP8", "AV1"))
        assert "the browser offers VP8, AV1; this worker sends H264" in str(refused.value)
        assert session.pipeline.codec == "H264" and session.pc is None
    finally:
        await session.close("test_done")
    assert ended == ["test_done"]


# -- signaling keeps a browser away from workers that cannot serve it -------------------------


async def test_a_browser_whose_codecs_no_worker_sends_is_told_both_sides(tmp_path: Any) -> None:
    args = ["--resolution", "160x96", "--renderer", "cpu", "--encoder", "x264", "--codecs", "H264"]
    with local_server(*args, log_path=tmp_path / "serve.log", cwd=ROOT, timeout=120) as server:
        ws_url = server.url.replace("http", "ws", 1) + "/ws"
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(ws_url) as ws:
                start = {"type": "session.start", "requirements": {"codecs": ["VP8", "AV1"]}}
                await ws.send_str(json.dumps({"v": 1, **start}))
                error = await receive(ws)
                assert (error["type"], error["code"]) == ("error", "no_capacity")
                assert error["message"] == (
                    "no registered worker sends a codec this browser decodes: the browser "
                    "takes VP8, AV1; the workers send H264"
                )
                assert (await receive(ws))["reason"] == "no_capacity"  # session.ended
            async with http.ws_connect(ws_url) as ws:  # one codec in common is enough
                start = {"type": "session.start", "requirements": {"codecs": ["VP8", "H264"]}}
                await ws.send_str(json.dumps({"v": 1, **start}))
                started = await receive(ws)
                assert (started["type"], started["codec"]) == ("session.started", "H264")


def test_a_decoders_frame_size_limit_shrinks_the_stream_keeping_its_shape() -> None:
    limits = QualityLimits(Resolution(3840, 2160), 60.0, 50_000, max_macroblocks=12288)
    fitted = limits.fit(Resolution(3840, 2160))  # Firefox's VP8 limit against 4K's 32400
    assert macroblocks(fitted) <= 12288 and fitted.width % 2 == 0 == fitted.height % 2
    assert abs(fitted.width / fitted.height - 16 / 9) < 0.01 and fitted.width > 2300
    assert limits.fit(Resolution(1920, 1080)) == Resolution(1920, 1080)  # 8160: fits as it is
    assert QualityLimits(Resolution(3840, 2160), 60.0, 1).fit(Resolution(3840, 2160)) == (
        Resolution(3840, 2160)
    )


def _with_vp8_limits(sdp: str, fmtp: str) -> str:
    """`sdp` with an fmtp line for its VP8 entry, as Firefox writes one."""
    pt = next(line.split()[0].split(":")[1] for line in sdp.splitlines() if "VP8/90000" in line)
    return sdp.replace(f"a=rtpmap:{pt} VP8/90000\r\n", f"a=rtpmap:{pt} VP8/90000\r\n"
                       f"a=fmtp:{pt} {fmtp}\r\n")  # fmt: skip


async def test_a_vp8_offer_with_firefoxs_limits_steps_the_stream_down(scene: Scene) -> None:
    offer = _with_vp8_limits(await _offer("VP8"), "max-fs=3600;max-fr=24")
    assert decoder_limits(offer, "VP8") == (3600, 24.0)
    assert decoder_limits(offer, "H264") == (None, None)
    stream = StreamConfig(resolution=Resolution(1920, 1080), renderer="cpu", encoder="x264")
    worker = LocalWorker("w", scene, stream, 1, Metrics())

    async def on_end(reason: str) -> None:
        pass

    session = await worker.open_session("d" * 32, on_end)
    try:
        await session.accept_offer(offer)
        assert session.quality.resolution == Resolution(1280, 720)  # 3600 macroblocks exactly
        assert session.quality.fps == 24.0
        assert session.input.quality_limits.max_macroblocks == 3600
        # the same session offered again by a browser without limits: the worker's come back
        await session.accept_offer(await _offer("VP8"))
        assert session.input.quality_limits.max_macroblocks is None
        assert session.input.quality_limits.max_fps == 30.0
    finally:
        await session.close("test_done")
