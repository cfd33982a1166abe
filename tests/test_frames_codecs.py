"""The measuring tools for every codec: keyframes told, frames depayloaded and decoded for VP8
(aiortc's packetization of libvpx output) and AV1 (ours of SVT-AV1's), and the receiver hook
naming the codec of what a real aiortc peer connection receives."""

from __future__ import annotations

import asyncio
import fractions
from typing import Any

import av
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCRtpSender
from aiortc.codecs.vpx import Vp8Encoder, VpxPayloadDescriptor

from render_server.tools.loadtest.sampling import SamplingAssembler
from render_server.tools.measure.frames import (
    FrameAssembler,
    FrameDecoder,
    ObservedFrame,
    payload_format,
    vp8_keyframe,
)
from render_server.transport.av1_codec import register_av1
from render_server.transport.av1_rtp import packetize_av1
from render_server.transport.receiver_hook import observe_receiver

from .support import PacketTrack
from .test_av1_rtp import encode_av1

WIDTH, HEIGHT = 320, 240


def encode_vp8(count: int, keyframes: tuple[int, ...] = (0,)) -> list[av.Packet[Any]]:
    """libvpx in real-time mode, keyframes where asked only; pts in 1/90000."""
    encoder = av.CodecContext.create("libvpx", "w")
    encoder.width, encoder.height, encoder.pix_fmt = WIDTH, HEIGHT, "yuv420p"
    encoder.time_base = fractions.Fraction(1, 90000)
    encoder.framerate = fractions.Fraction(30)
    encoder.bit_rate = 1_000_000
    encoder.gop_size = 3000
    encoder.options = {"deadline": "realtime", "cpu-used": "8", "lag-in-frames": "0"}
    rng = np.random.default_rng(2)
    texture = rng.integers(0, 255, (HEIGHT, WIDTH), dtype=np.uint8)
    packets = []
    for i in range(count):
        image = np.full((HEIGHT * 3 // 2, WIDTH), 128, np.uint8)
        image[:HEIGHT] = np.roll(texture, 4 * i, axis=1)
        frame = av.VideoFrame.from_ndarray(image, format="yuv420p")
        frame.pts, frame.time_base = i * 3000, encoder.time_base
        if i in keyframes:
            frame.pict_type = av.video.frame.PictureType.I
        packets += encoder.encode(frame)
    packets += encoder.encode(None)
    for packet in packets:
        packet.time_base = encoder.time_base
    return packets


def vp8_payloads(packets: list[av.Packet[Any]]) -> list[list[bytes]]:
    return [Vp8Encoder._packetize(bytes(p), 1000 + i) for i, p in enumerate(packets)]


def av1_payloads(packets: list[av.Packet[Any]]) -> list[list[bytes]]:
    return [packetize_av1(bytes(p), 400) for p in packets]


def feed(assembler: FrameAssembler, frames: list[list[bytes]], seq: int = 65530) -> None:
    """Each frame's payloads in order, marker on its last, 30 fps timestamps."""
    for i, payloads in enumerate(frames):
        for j, payload in enumerate(payloads):
            assembler.add(seq & 0xFFFF, 3000 * i, j == len(payloads) - 1, payload, float(seq))
            seq += 1


class Keep:
    def __init__(self) -> None:
        self.frames: list[tuple[ObservedFrame, bytes]] = []

    def __call__(self, frame: ObservedFrame, access_unit: bytes) -> None:
        self.frames.append((frame, access_unit))


# -- VP8 -----------------------------------------------------------------------------------------


def test_vp8_keyframes_are_told_by_the_first_packet_of_a_key_frame() -> None:
    packets = encode_vp8(6, keyframes=(0, 4))
    frames = vp8_payloads(packets)
    assert [p.is_keyframe for p in packets] == [True, False, False, False, True, False]
    assert len(frames[0]) > 1  # a key frame that spans packets: only its first one tells
    assert [[vp8_keyframe(p) for p in f] for f in frames] == [
        [p.is_keyframe and j == 0 for j in range(len(f))]
        for p, f in zip(packets, frames, strict=True)
    ]
    key = frames[0][0]
    # S=0 or another partition: not a frame's start, whatever the payload header says
    not_start = bytes(VpxPayloadDescriptor(partition_start=0, partition_id=0)) + key[4:]
    assert not vp8_keyframe(not_start)
    assert not vp8_keyframe(bytes(VpxPayloadDescriptor(1, 1)) + key[4:])
    assert not vp8_keyframe(b"") and not vp8_keyframe(b"\x90")  # no room for the header
    assert not vp8_keyframe(bytes([0x90, 0x80]))  # PictureID cut short: not parsed


@pytest.mark.parametrize("mode", ["keyframes", "all"])
def test_vp8_frames_assemble_and_decode(mode: str) -> None:
    packets = encode_vp8(6, keyframes=(0, 4))
    decoder = FrameDecoder(mode)  # type: ignore[arg-type]
    kept = Keep()

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        kept(frame, access_unit)
        decoder.offer(frame, access_unit)

    assembler = FrameAssembler(on_frame, keep_payload=True, codec="VP8")
    feed(assembler, vp8_payloads(packets))
    decoder.close()
    assert [f.keyframe for f, _ in kept.frames] == [p.is_keyframe for p in packets]
    assert all(f.complete and f.codec == "VP8" for f, _ in kept.frames)
    assert [unit for _, unit in kept.frames] == [bytes(p) for p in packets]  # descriptors gone
    assert decoder.stats.errors == 0
    assert decoder.stats.sizes == {(WIDTH, HEIGHT): 2 if mode == "keyframes" else 6}


# -- AV1 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["keyframes", "all"])
def test_av1_frames_assemble_and_decode(mode: str) -> None:
    packets = encode_av1(WIDTH, HEIGHT, 5, 600_000)
    frames = av1_payloads(packets)
    assert len(frames[0]) > 1
    decoder = FrameDecoder(mode)  # type: ignore[arg-type]
    kept = Keep()

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        kept(frame, access_unit)
        decoder.offer(frame, access_unit)

    assembler = FrameAssembler(on_frame, keep_payload=True)
    assembler.set_codec("av1")  # as the receiver hook says it, any case
    feed(assembler, frames)
    decoder.close()
    assert [f.keyframe for f, _ in kept.frames] == [True, False, False, False, False]
    assert all(f.complete and f.codec == "AV1" for f, _ in kept.frames)
    assert [unit for _, unit in kept.frames] == [bytes(p) for p in packets]
    assert decoder.stats.errors == 0
    assert decoder.stats.sizes == {(WIDTH, HEIGHT): 1 if mode == "keyframes" else 5}


def test_a_frame_that_does_not_depayload_is_counted_and_passes_no_bytes() -> None:
    kept = Keep()
    assembler = FrameAssembler(kept, keep_payload=True, codec="AV1")
    good = packetize_av1(bytes(encode_av1(WIDTH, HEIGHT, 1, 300_000)[0]), 400)
    feed(assembler, [good[1:] + good[:1]])  # in sequence order, but the fragments out of place
    ((frame, unit),) = kept.frames
    assert frame.complete and unit == b"" and assembler.stats.malformed == 1


def test_the_sampling_assembler_tells_keyframes_in_the_streams_format() -> None:
    kept: list[tuple[int, bool, int]] = []

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        kept.append((frame.rtp, frame.keyframe, len(access_unit)))

    assembler = SamplingAssembler(on_frame, every=2)
    assembler.set_codec("AV1")
    key = packetize_av1(bytes(encode_av1(WIDTH, HEIGHT, 1, 300_000)[0]))
    inter = [bytes([0x10]) + bytes([6 << 3, 0x30, 0x00])]  # W=1: one inter frame OBU
    frames = [key, inter, key, inter, inter, key]
    feed(assembler, frames)
    assert [(rtp, k) for rtp, k, size in kept if size] == [(0, True), (15000, True)]


def test_unknown_codecs_are_counted_never_keyframes_nor_decoded() -> None:
    fmt = payload_format("VP9")
    assert fmt.codec == "VP9" and fmt.decoder is None and not fmt.keyframe(b"\xff" * 8)
    assert payload_format("h264") is payload_format("H264")
    kept = Keep()
    assembler = FrameAssembler(kept, keep_payload=True)
    assembler.set_codec("VP9")
    feed(assembler, [[b"ab", b"cd"]])
    assert [(f.codec, f.keyframe, unit) for f, unit in kept.frames] == [("VP9", False, b"abcd")]


# -- through a real aiortc receiver ----------------------------------------------------------------


@pytest.mark.parametrize("codec", ["VP8", "AV1"])
async def test_the_receiver_hook_names_the_codec_and_passes_its_packets(codec: str) -> None:
    register_av1()
    if codec == "VP8":
        packets = await asyncio.to_thread(encode_vp8, 6, (0, 3))
    else:
        packets = await asyncio.to_thread(encode_av1, WIDTH, HEIGHT, 6, 600_000)
    told: list[str] = []
    decoder = FrameDecoder("all")
    frames: list[ObservedFrame] = []
    done = asyncio.Event()

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        frames.append(frame)
        decoder.offer(frame, access_unit)
        if len(frames) == len(packets):
            done.set()

    assembler = FrameAssembler(on_frame, keep_payload=True)  # H264 until it hears otherwise

    def on_codec(name: str) -> None:
        told.append(name)
        assembler.set_codec(name)

    sender, receiver = RTCPeerConnection(), RTCPeerConnection()
    try:
        transceiver = receiver.addTransceiver("video", direction="recvonly")
        observe_receiver(transceiver.receiver, assembler.add, on_codec=on_codec)
        sending = sender.addTransceiver(PacketTrack(packets), direction="sendonly")
        wanted = (f"video/{codec}".lower(), "video/rtx")
        caps = RTCRtpSender.getCapabilities("video").codecs
        sending.setCodecPreferences([c for c in caps if c.mimeType.lower() in wanted])
        await receiver.setLocalDescription(await receiver.createOffer())
        await sender.setRemoteDescription(receiver.localDescription)
        await sender.setLocalDescription(await sender.createAnswer())
        await receiver.setRemoteDescription(sender.localDescription)
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await sender.close()
        await receiver.close()
        decoder.close()
    assert told == [codec]
    assert [f.keyframe for f in frames] == [p.is_keyframe for p in packets]
    assert all(f.complete and f.codec == codec for f in frames)
    assert decoder.stats.errors == 0 and decoder.stats.sizes == {(WIDTH, HEIGHT): len(packets)}


async def test_the_hook_unwraps_retransmissions_and_names_the_codec_they_repair() -> None:
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters
    from aiortc.rtp import RtpPacket, wrap_rtx

    register_av1()
    pc = RTCPeerConnection()
    receiver = pc.addTransceiver("video", direction="recvonly").receiver
    av1 = RTCRtpCodecParameters(mimeType="video/AV1", clockRate=90000, payloadType=45)
    rtx = RTCRtpCodecParameters(
        mimeType="video/rtx", clockRate=90000, payloadType=46, parameters={"apt": 45}
    )
    receiver._RTCRtpReceiver__codecs.update({45: av1, 46: rtx})  # type: ignore[attr-defined]
    receiver._RTCRtpReceiver__rtx_ssrc[2222] = 1111  # type: ignore[attr-defined]
    seen: list[tuple[int, int, bytes]] = []
    told: list[str] = []
    observe_receiver(
        receiver,
        lambda seq, ts, m, payload, t: seen.append((seq, ts, payload)),
        on_codec=told.append,
    )
    payload = bytes([0x18]) + bytes([6 << 3, 0x10, 0x00])
    packet = RtpPacket(payload_type=45, sequence_number=7, timestamp=9000, ssrc=1111)
    packet.payload = payload
    await receiver._handle_rtp_packet(packet, 0)
    repair = wrap_rtx(packet, payload_type=46, sequence_number=500, ssrc=2222)
    await receiver._handle_rtp_packet(repair, 0)
    unknown = RtpPacket(payload_type=99, sequence_number=8, timestamp=9000, ssrc=1111)
    await receiver._handle_rtp_packet(unknown, 0)  # no codec of that type: not passed on
    await pc.close()
    assert seen == [(7, 9000, payload), (7, 9000, payload)]
    assert told == ["AV1"]
