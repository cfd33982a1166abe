"""Transport-cc feedback from an aiortc receiver: the sans-IO generator, its attachment to a
receiver, and two real peer connections on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fractions
import time
from collections.abc import Iterator

import av
import pytest
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpSender,
    VideoStreamTrack,
    codecs,
)
from aiortc.rtcrtpparameters import RTCRtpCodecParameters, RTCRtpHeaderExtensionParameters
from aiortc.rtp import HeaderExtensions, HeaderExtensionsMap, RtpPacket

from render_server.transport.feedback_generator import (
    BACK_WINDOW_US,
    TransportFeedbackGenerator,
    send_transport_feedback,
)
from render_server.transport.header_extensions import TRANSPORT_CC_URI
from render_server.transport.receiver_hook import observe_receiver
from render_server.transport.transport_feedback import (
    TransportFeedback,
    arrivals_of,
    transport_feedback_packets,
)


def statuses(feedback: list[TransportFeedback]) -> list[tuple[int, int | None]]:
    return [p for fb in feedback for p in fb.packets]


def near(arrival: int | None, wanted: int) -> bool:
    return arrival is not None and abs(arrival - wanted) <= 125


# -- the generator, without I/O ---------------------------------------------------------------


def test_everything_received_since_the_last_build_in_one_packet() -> None:
    generator = TransportFeedbackGenerator(sender_ssrc=11, media_ssrc=22)
    for seq in range(10):
        generator.on_packet(100 + seq, 5_000_000 + seq * 1_000)
    [fb] = generator.build(5_010_000)
    assert (fb.sender_ssrc, fb.media_ssrc, fb.base_sequence, fb.feedback_count) == (11, 22, 100, 0)
    assert [s for s, _ in fb.packets] == list(range(100, 110))
    assert all(near(a, 5_000_000 + i * 1_000) for i, (_, a) in enumerate(fb.packets))
    assert generator.build(5_060_000) == []  # nothing new
    generator.on_packet(110, 5_070_000, media_ssrc=33)
    [fb] = generator.build(5_080_000)
    assert (fb.base_sequence, fb.media_ssrc, fb.feedback_count, len(fb.packets)) == (110, 33, 1, 1)
    assert generator.feedback_count == 2


def test_missing_numbers_are_reported_lost_and_trailing_ones_wait() -> None:
    generator = TransportFeedbackGenerator()
    for seq in (0, 1, 2, 5, 6):
        generator.on_packet(seq, seq * 1_000)
    [fb] = generator.build(10_000)
    assert [(s, a is not None) for s, a in fb.packets] == [
        (0, True), (1, True), (2, True), (3, False), (4, False), (5, True), (6, True),
    ]  # fmt: skip
    # 7 and 8 never come: the next feedback begins with them, lost, before 9
    generator.on_packet(9, 20_000)
    [fb] = generator.build(30_000)
    assert fb.base_sequence == 7 and [a is not None for _, a in fb.packets] == [False, False, True]


def test_a_packet_reported_lost_that_arrives_late_is_reported_again() -> None:
    generator = TransportFeedbackGenerator()
    for seq in (0, 2, 3):
        generator.on_packet(seq, seq * 1_000)
    [first] = generator.build(4_000)
    assert first.packets[1] == (1, None)
    generator.on_packet(1, 4_500)  # reordered beyond the feedback interval
    generator.on_packet(4, 5_000)
    [again] = generator.build(6_000)
    assert again.base_sequence == 1  # from the late one on, as libwebrtc does
    assert [s for s, _ in again.packets] == [1, 2, 3, 4]
    assert near(again.packets[0][1], 4_500) and near(again.packets[3][1], 5_000)
    assert arrivals_of([first, again]).keys() == {0, 1, 2, 3, 4}
    assert None not in arrivals_of([first, again]).values()


def test_duplicates_keep_their_first_arrival() -> None:
    generator = TransportFeedbackGenerator()
    generator.on_packet(1, 1_000)
    generator.on_packet(1, 9_000)
    generator.on_packet(2, 2_000)
    [fb] = generator.build(10_000)
    assert [s for s, _ in fb.packets] == [1, 2] and near(fb.packets[0][1], 1_000)


def test_feedback_is_split_at_about_1000_bytes() -> None:
    generator = TransportFeedbackGenerator(max_packet_bytes=1000)
    arrival = 0
    for seq in range(3000):
        arrival += 70_000 if seq % 3 == 0 else 1_000  # large deltas: 2 bytes and vectors
        if seq % 5 != 4:  # every fifth lost
            generator.on_packet(seq, arrival)
    feedback = generator.build(arrival)
    assert len(feedback) > 3
    assert all(len(bytes(fb)) <= 1000 for fb in feedback)
    assert [fb.feedback_count for fb in feedback] == list(range(len(feedback)))
    # one after the other, each from where the last ended, every number once
    assert [s for s, _ in statuses(feedback)] == list(range(2999))  # 2999 lost: trailing
    lost = [s for s, a in statuses(feedback) if a is None]
    assert lost == [s for s in range(2999) if s % 5 == 4]
    for fb in feedback:  # each may begin with the lost ones before its first received
        assert any(a is not None for _, a in fb.packets)
        assert TransportFeedback.parse(bytes(fb)[4:]) == fb


def test_feedback_is_split_where_a_delta_would_not_fit_16_bits() -> None:
    generator = TransportFeedbackGenerator()
    generator.on_packet(0, 0)
    generator.on_packet(1, 1_000)
    generator.on_packet(2, 10_000_000)  # 10 s later: beyond ±8.19 s
    first, second = generator.build(10_000_000)
    assert [s for s, _ in first.packets] == [0, 1]
    assert second.base_sequence == 2 and near(second.packets[0][1], 10_000_000)


def test_sequence_numbers_wrap_within_and_across_feedback() -> None:
    generator = TransportFeedbackGenerator()
    for i, seq in enumerate([65530, 65531, 65532, 65534, 65535, 0, 1]):
        generator.on_packet(seq, i * 1_000)
    [fb] = generator.build(10_000)
    assert fb.base_sequence == 65530
    assert [s for s, _ in fb.packets] == [65530, 65531, 65532, 65533, 65534, 65535, 0, 1]
    assert fb.packets[3] == (65533, None)
    generator.on_packet(3, 20_000)
    [fb] = generator.build(30_000)
    assert fb.packets == ((2, None), (3, fb.packets[1][1]))


def test_old_reported_packets_are_forgotten() -> None:
    generator = TransportFeedbackGenerator()
    generator.on_packet(0, 0)
    generator.on_packet(2, 1_000)
    generator.build(2_000)
    generator.build(2_000 + BACK_WINDOW_US + 1)  # now both are old: forgotten
    generator.on_packet(1, 3_000 + BACK_WINDOW_US)  # too late to report
    assert generator.build(4_000 + BACK_WINDOW_US) == []
    generator.on_packet(3, 5_000 + BACK_WINDOW_US)
    [fb] = generator.build(6_000 + BACK_WINDOW_US)
    assert [s for s, _ in fb.packets] == [3]


def test_a_long_jump_reports_at_most_0x7ffe_lost_before_the_first_received() -> None:
    generator = TransportFeedbackGenerator()
    generator.on_packet(0, 0)
    generator.build(1_000)
    generator.on_packet(32_000, 2_000)  # forward, within half the number space
    [fb] = generator.build(3_000)
    assert fb.base_sequence == 1 and len(fb.packets) == 32_000
    assert len(bytes(fb)) < 100  # runs of lost packets are cheap


# -- attached to a receiver -------------------------------------------------------------------


def vp8_packet(seq: int, transport_seq: int | None, ssrc: int = 4321) -> RtpPacket:
    packet = RtpPacket(payload_type=96, sequence_number=seq, timestamp=9000 * seq, ssrc=ssrc)
    packet.payload = b"\x10" + bytes(20)
    packet.extensions.transport_sequence_number = transport_seq
    return packet


@pytest.mark.parametrize("feedback_first", [True, False])
async def test_the_attachment_composes_with_the_receiver_hook(feedback_first: bool) -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    receiver = pc.addTransceiver("video", direction="recvonly").receiver
    vp8 = RTCRtpCodecParameters(mimeType="video/VP8", clockRate=90000, payloadType=96)
    receiver._RTCRtpReceiver__codecs[96] = vp8  # type: ignore[attr-defined]
    receiver._set_rtcp_ssrc(1234)
    sent: list[bytes] = []

    async def capture(packet: object) -> None:
        sent.append(bytes(packet))  # type: ignore[call-overload]

    receiver._send_rtcp = capture  # type: ignore[method-assign]
    seen: list[int] = []
    handle = None
    if feedback_first:
        handle = send_transport_feedback(receiver, interval_s=0.01)
    observe_receiver(receiver, lambda seq, *_: seen.append(seq), decode_in_aiortc=True)
    if handle is None:
        handle = send_transport_feedback(receiver, interval_s=0.01)
    try:
        for seq, transport_seq in [(1, 500), (2, 501), (3, None), (4, 503)]:
            await receiver._handle_rtp_packet(vp8_packet(seq, transport_seq), 0)
        deadline = time.monotonic() + 5
        while handle.sent < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert seen == [1, 2, 3, 4]  # the hook saw every packet
        [fb] = [f for datagram in sent for f in transport_feedback_packets(datagram)]
        assert (fb.sender_ssrc, fb.media_ssrc) == (1234, 4321)
        assert [(s, a is not None) for s, a in fb.packets] == [
            (500, True), (501, True), (502, False), (503, True),
        ]  # fmt: skip
    finally:
        await pc.close()
    assert handle.task is not None
    await asyncio.wait_for(handle.task, 2)  # ends once the receiver's transport closes
    assert handle.stopped


async def test_stop_ends_the_task_and_the_recording() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    receiver = pc.addTransceiver("video", direction="recvonly").receiver
    handle = send_transport_feedback(receiver, interval_s=0.01)
    handle.stop()
    await receiver._handle_rtp_packet(vp8_packet(1, 7), 0)
    assert handle.task is not None
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(handle.task, 2)
    assert handle.task.cancelled()
    assert handle.stopped and handle.generator.build(10**9) == []
    await pc.close()


def test_a_receiver_without_the_hook_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no packet hook"):
        send_transport_feedback(object())  # type: ignore[arg-type]


# -- two peer connections on loopback ---------------------------------------------------------


@contextlib.contextmanager
def transport_cc_negotiated() -> Iterator[None]:
    """Offer and answer the transport-wide sequence number extension, for this test only."""
    video = codecs.HEADER_EXTENSIONS["video"]
    saved = list(video)
    if not any(ext.uri == TRANSPORT_CC_URI for ext in video):
        used = {e.id for kind in codecs.HEADER_EXTENSIONS.values() for e in kind}
        free = min(set(range(1, 15)) - used)
        video.append(RTCRtpHeaderExtensionParameters(id=free, uri=TRANSPORT_CC_URI))
    try:
        yield
    finally:
        video[:] = saved


class NumberingExtensionsMap(HeaderExtensionsMap):
    """aiortc's map, numbering every packet it writes with a transport-wide sequence number
    (aiortc's sender writes none of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def set(self, values: HeaderExtensions) -> tuple[int, bytes]:
        numbered = dataclasses.replace(values, transport_sequence_number=self.written & 0xFFFF)
        self.written += 1
        return super().set(numbered)


class SmallFrames(VideoStreamTrack):
    """Small grey frames at aiortc's 30 fps, cheap to encode."""

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        frame = av.VideoFrame(96, 64, "yuv420p")
        for plane in frame.planes:
            plane.update(bytes([128]) * plane.buffer_size)
        frame.pts, frame.time_base = pts, fractions.Fraction(time_base)
        return frame


async def test_an_aiortc_receiver_sends_feedback_the_sender_can_read() -> None:
    config = RTCConfiguration(iceServers=[])
    with transport_cc_negotiated():
        sender, receiver = RTCPeerConnection(config), RTCPeerConnection(config)
        try:
            receiving = receiver.addTransceiver("video", direction="recvonly")
            observed: list[int] = []
            observe_receiver(receiving.receiver, lambda seq, *_: observed.append(seq))
            handle = send_transport_feedback(receiving.receiver, interval_s=0.05)
            sending = sender.addTransceiver(SmallFrames(), direction="sendonly")
            caps = RTCRtpSender.getCapabilities("video").codecs
            sending.setCodecPreferences([c for c in caps if c.mimeType == "video/VP8"])
            numbering = NumberingExtensionsMap()
            sending.sender._RTCRtpSender__rtp_header_extensions_map = numbering  # type: ignore[attr-defined]
            await receiver.setLocalDescription(await receiver.createOffer())
            assert TRANSPORT_CC_URI in receiver.localDescription.sdp
            await sender.setRemoteDescription(receiver.localDescription)
            await sender.setLocalDescription(await sender.createAnswer())
            assert TRANSPORT_CC_URI in sender.localDescription.sdp
            # the sender's side: every plaintext RTCP datagram it receives
            feedback: list[TransportFeedback] = []
            dtls = sending.sender.transport
            inner = dtls._handle_rtcp_data

            async def read_rtcp(data: bytes) -> None:
                feedback.extend(transport_feedback_packets(data))
                await inner(data)

            dtls._handle_rtcp_data = read_rtcp  # type: ignore[method-assign]
            await receiver.setRemoteDescription(sender.localDescription)

            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                covered = arrivals_of(feedback)
                if numbering.written >= 40 and all(covered.get(s) is not None for s in range(40)):
                    break
                await asyncio.sleep(0.05)
            sent_ssrc = sending.sender._ssrc
            rtcp_ssrc = receiving.receiver._RTCRtpReceiver__rtcp_ssrc  # type: ignore[attr-defined]
        finally:
            await sender.close()
            await receiver.close()
    assert handle.task is not None
    await asyncio.wait_for(handle.task, 2)  # the receiver stopped: so did the feedback
    assert handle.stopped and handle.sent >= 1
    assert observed, "the receiver hook saw no packet"
    # every packet numbered so far is reported received (loopback loses none), by the receiver
    # about the sender's stream, in feedback packets counted one after the other
    covered = arrivals_of(feedback)
    assert all(covered.get(s) is not None for s in range(40)), sorted(covered)[:50]
    assert {(fb.sender_ssrc, fb.media_ssrc) for fb in feedback} == {(rtcp_ssrc, sent_ssrc)}
    counts = [fb.feedback_count for fb in feedback]
    assert counts == list(range(len(counts)))
    # arrival times are on one clock: in sequence order they do not run backwards by much
    times = [covered[s] for s in range(40)]
    assert all(b - a > -5_000 for a, b in zip(times, times[1:], strict=False))  # type: ignore[operator]
