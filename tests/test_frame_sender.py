"""The frame sender writes the packets aiortc's own loop would: the same bytes for the same
numbers and header-extension values, sequence numbers across the 16-bit wrap, the marker on
each frame's last packet; its retransmission history holds packets that serialize to what was
sent; and a real session through it reaches an aiortc receiver whole (tests/test_send_path.py
and the browser tests run every paced session through it)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import HeaderExtensions, HeaderExtensionsMap, RtpPacket

from render_server.transport.frame_sender import ExtensionBlock, FrameSender, serialize_frame
from render_server.transport.header_extensions import (
    PLAYOUT_DELAY_URI,
    TRANSPORT_CC_URI,
    SenderExtensionsMap,
)
from render_server.transport.retransmission import history_size

MID_URI = "urn:ietf:params:rtp-hdrext:sdes:mid"
ABS_SEND_TIME_URI = "http://www.webrtc.org/experiments/rtp-hdrext/abs-send-time"


def extension_map(with_ours: bool) -> HeaderExtensionsMap:
    chosen = SenderExtensionsMap((0, 50), transport_cc=True) if with_ours else HeaderExtensionsMap()
    chosen.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=1, uri=MID_URI),
        RTCRtpHeaderExtensionParameters(id=3, uri=ABS_SEND_TIME_URI),
        RTCRtpHeaderExtensionParameters(id=5, uri=TRANSPORT_CC_URI),
        RTCRtpHeaderExtensionParameters(id=6, uri=PLAYOUT_DELAY_URI),
    ]))  # fmt: skip
    return chosen


def aiortc_packets(
    payloads: Sequence[bytes], first: int, timestamp: int, extensions: HeaderExtensions,
    chosen: HeaderExtensionsMap,
) -> list[bytes]:  # fmt: skip
    """What aiortc's `_run_rtp` serializes for the same frame."""
    out = []
    for i, payload in enumerate(payloads):
        packet = RtpPacket(payload_type=102, sequence_number=(first + i) & 0xFFFF,
                           timestamp=timestamp, ssrc=0xDEADBEEF, payload=payload)  # fmt: skip
        packet.marker = int(i == len(payloads) - 1)
        packet.extensions = extensions
        out.append(packet.serialize(chosen))
    return out


@pytest.mark.parametrize("with_ours", [True, False])
@pytest.mark.parametrize("first", [0, 1000, 65534])
def test_the_same_bytes_as_aiortcs_serializer(with_ours: bool, first: int) -> None:
    payloads = [bytes([i]) * (1100 - 37 * i) for i in range(5)]
    extensions = HeaderExtensions(abs_send_time=0x123456, mid="0")
    chosen = extension_map(with_ours)
    ours = serialize_frame(payloads, 102, first, 4_000_000_000, 0xDEADBEEF,
                           chosen.set(extensions))  # fmt: skip
    assert ours == aiortc_packets(payloads, first, 4_000_000_000, extensions, chosen)
    parsed = [RtpPacket.parse(p) for p in ours]
    assert [p.sequence_number for p in parsed] == [(first + i) & 0xFFFF for i in range(5)]
    assert [p.marker for p in parsed] == [0, 0, 0, 0, 1]


@pytest.mark.parametrize("with_ours", [True, False])
@pytest.mark.parametrize("negotiated", [(1, 3), (3,), (1,), ()])
def test_the_frames_extension_block_is_what_the_map_builds(
    with_ours: bool, negotiated: tuple[int, ...]
) -> None:
    """Built once and given each frame's abs-send-time, the block is the map's own."""
    uris = {1: MID_URI, 3: ABS_SEND_TIME_URI, 5: TRANSPORT_CC_URI, 6: PLAYOUT_DELAY_URI}
    chosen = SenderExtensionsMap((0, 50), transport_cc=True) if with_ours else HeaderExtensionsMap()
    ids = (*negotiated, 5, 6) if with_ours else negotiated
    chosen.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=i, uri=uris[i]) for i in ids
    ]))  # fmt: skip
    block = ExtensionBlock(chosen, "0")
    for abs_send_time in (0, 1, 0x123456, 0xFFFFFF, 0xABCDEF):
        extensions = HeaderExtensions(abs_send_time=abs_send_time, mid="0")
        assert block.build(extensions) == chosen.set(extensions)


def test_a_block_that_changes_otherwise_is_built_each_frame() -> None:
    class Counting(HeaderExtensionsMap):
        calls = 0

        def set(self, values: HeaderExtensions) -> tuple[int, bytes]:
            self.calls += 1
            profile, data = super().set(values)
            return profile, data + bytes([self.calls % 256]) * 4  # a value that moves

    chosen = Counting()
    chosen.configure(RTCRtpParameters(headerExtensions=[
        RTCRtpHeaderExtensionParameters(id=3, uri=ABS_SEND_TIME_URI)
    ]))  # fmt: skip
    block = ExtensionBlock(chosen, None)
    built = block.build(HeaderExtensions(abs_send_time=7))
    assert chosen.calls == 3 and built[1].endswith(bytes([3]) * 4)


def test_no_extensions_no_extension_bit() -> None:
    ours = serialize_frame(
        [b"\x01\x02"], 96, 7, 9, 1, HeaderExtensionsMap().set(HeaderExtensions())
    )
    assert ours == [bytes([0x80, 0x80 | 96, 0, 7, 0, 0, 0, 9, 0, 0, 0, 1, 1, 2])]


class StubTrack:
    """Frames for the loop, then the end of the track."""

    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


class StubSender:
    """An RTCRtpSender as far as the frame sender reads it (aiortc's private names)."""

    def __init__(self, frames: list[list[bytes]]) -> None:
        self._ssrc = 0xDEADBEEF
        self._RTCRtpSender__rtp_started = asyncio.Event()
        self._RTCRtpSender__rtp_exited = asyncio.Event()
        self._RTCRtpSender__track: StubTrack | None = StubTrack()
        self._RTCRtpSender__encoder: object | None = object()
        self._RTCRtpSender__mid = "0"
        self._RTCRtpSender__rtp_history: dict[int, RtpPacket] = {}
        self._RTCRtpSender__rtp_header_extensions_map = extension_map(True)
        self._RTCRtpSender__ntp_timestamp = 0
        self._RTCRtpSender__rtp_timestamp = 0
        self._RTCRtpSender__octet_count = 0
        self._RTCRtpSender__packet_count = 0
        self._frames = frames
        self.track = self._RTCRtpSender__track

    async def _next_encoded_frame(self, codec: Any) -> Any:
        from aiortc.mediastreams import MediaStreamError

        if not self._frames:
            raise MediaStreamError
        payloads = self._frames.pop(0)
        return type("Frame", (), {"payloads": payloads, "timestamp": 3000 * len(self._frames)})


async def test_the_loop_sends_frames_whole_and_keeps_what_aiortc_keeps() -> None:
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters

    frames = [[bytes([f, i]) * 500 for i in range(n)] for f, n in enumerate([3, 1, 4])]
    sender = StubSender([list(f) for f in frames])
    sent: list[list[bytes]] = []
    extensions = sender._RTCRtpSender__rtp_header_extensions_map
    repeats: list[bool] = []

    async def send_frame(packets: Sequence[bytes]) -> None:
        sent.append(list(packets))
        # the history serializes to what left: a retransmission repeats the packet
        history = sender._RTCRtpSender__rtp_history
        for data in packets:
            kept = history[RtpPacket.parse(data).sequence_number % history_size()]
            repeats.append(kept.serialize(extensions) == data)

    frame_sender = FrameSender(sender, send_frame)
    frame_sender.install()
    codec = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
    await sender._run_rtp(codec)  # type: ignore[attr-defined]

    assert [len(s) for s in sent] == [3, 1, 4] and frame_sender.frames == 3
    packets = [RtpPacket.parse(p) for s in sent for p in s]
    numbers = [p.sequence_number for p in packets]
    assert numbers == [(numbers[0] + i) & 0xFFFF for i in range(8)]
    assert [p.marker for p in packets] == [0, 0, 1, 1, 0, 0, 0, 1]
    assert [p.payload for p in packets] == [p for f in frames for p in f]
    assert repeats == [True] * 8
    # and is emptied when the loop ends, not left for the collector with the peer connection
    assert not sender._RTCRtpSender__rtp_history
    assert sender._RTCRtpSender__packet_count == 8
    assert sender._RTCRtpSender__octet_count == sum(len(p) for f in frames for p in f)
    # the track ended: the loop stopped it, released the encoder and said it exited
    assert sender.track is not None and sender.track.stopped
    assert sender._RTCRtpSender__encoder is None
    assert sender._RTCRtpSender__rtp_started.is_set() and sender._RTCRtpSender__rtp_exited.is_set()


def test_a_kept_packet_wraps_in_rtx_as_aiortcs_own() -> None:
    from aiortc.rtp import wrap_rtx

    from render_server.transport.frame_history import HistoryPacket

    extensions = HeaderExtensions(abs_send_time=0x123456, mid="0")
    chosen = extension_map(with_ours=True)
    kept = HistoryPacket(102, 1, 65535, 90_000, 0xDEADBEEF, b"payload" * 100, extensions)
    theirs = RtpPacket(102, 1, 65535, 90_000, 0xDEADBEEF, b"payload" * 100)
    theirs.extensions = extensions
    assert isinstance(kept, RtpPacket)
    assert kept.serialize(chosen) == theirs.serialize(chosen)
    assert wrap_rtx(kept, payload_type=103, sequence_number=7, ssrc=42).serialize(
        chosen
    ) == wrap_rtx(theirs, payload_type=103, sequence_number=7, ssrc=42).serialize(chosen)


def test_the_frames_ntp_time_is_aiortcs() -> None:
    from aiortc.clock import current_ntp_time

    from render_server.transport.frame_sender import ntp_now

    before, ours, after = current_ntp_time(), ntp_now(), current_ntp_time()
    # aiortc's is truncated to the microsecond: ours may be ahead of `before` by that much
    assert before - (1 << 32) // 1_000_000 <= ours <= after + (1 << 32) // 1_000_000
    assert (after - before) >> 32 < 1  # the three were read together
