"""A paced sender's RTP loop: each encoded frame packetized, serialized and handed to the send
path in one call, not a coroutine hop and a header-extension rebuild per packet.

aiortc's `RTCRtpSender._run_rtp` builds every packet's header extensions anew (ours add the
playout delay and the transport-wide placeholder to aiortc's: a pack, unpack and pack per
packet) and awaits the transport once per packet. Here the frame's extension block is built
once (aiortc's abs-send-time is read once per frame: the packets leave together, or as the
pacer lets them, which no header written now could tell) and each packet is its 12-byte header,
that block and its payload: the same bytes aiortc's `RtpPacket.serialize` writes for the same
numbers and extension values (tests/test_frame_sender.py). The frame then goes to
`SendPath.send_frame` in one call. What aiortc's loop keeps up to date is kept the same way:
the retransmission history (a frame at a time, `frame_history`: the `RtpPacket`s that
`_retransmit` and the probes' padding read are built when they ask), the sender report's
counters, the started and exited events, and the track stopped and the encoder released as
the loop ends. H.264 frames are packed by `h264_packer.H264Packer` (aiortc's payloads at a
third of the CPU), installed as the sender's encoder when the loop starts.

Checked against aiortc 1.16: `RTCRtpSender._run_rtp` (replaced per sender: `send` starts
`self._run_rtp(codec)`), `_next_encoded_frame`, and the private `__rtp_started`,
`__rtp_exited`, `__track`, `__encoder`, `__mid`, `__rtp_history`, `__rtp_header_extensions_map`,
`__ntp_timestamp`, `__rtp_timestamp`, `__octet_count`, `__packet_count`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from struct import Struct
from typing import Any, Final, cast

from aiortc import rtcrtpsender
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import HeaderExtensions
from aiortc.utils import random32, uint32_add

from render_server.transport.frame_history import FrameHistory, sent_frame
from render_server.transport.h264_packer import H264Packer
from render_server.transport.retransmission import history_size

log = logging.getLogger(__name__)

HEADER: Final = Struct("!BBHLL")  # V=2 P X CC, M PT, sequence number, timestamp, SSRC
EXTENSION_HEADER: Final = Struct("!HH")  # profile, length in 32-bit words
NTP_UNIX_OFFSET_S: Final = 2_208_988_800  # 1900-01-01 to 1970-01-01


def ntp_now() -> int:
    """The wall clock as a 64-bit NTP timestamp, what aiortc's `current_ntp_time` gives (to
    the microsecond there), without building two datetimes for it on every frame."""
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    return (seconds + NTP_UNIX_OFFSET_S) << 32 | (nanoseconds << 32) // 1_000_000_000


def serialize_frame(
    payloads: Sequence[bytes],
    payload_type: int,
    first_sequence: int,
    timestamp: int,
    ssrc: int,
    extension: tuple[int, bytes],
) -> list[bytes]:
    """The frame's RTP packets, numbered from `first_sequence`, the marker on the last, each
    with the header extensions `extension` (a `HeaderExtensionsMap.set` result)."""
    profile, value = extension
    first = 0x90 if value else 0x80  # version 2, extension bit where there are extensions
    block = EXTENSION_HEADER.pack(profile, len(value) >> 2) + value if value else b""
    last, pack = len(payloads) - 1, HEADER.pack
    return [
        pack(first, (i == last) << 7 | payload_type, (first_sequence + i) & 0xFFFF, timestamp,
             ssrc) + block + payload
        for i, payload in enumerate(payloads)
    ]  # fmt: skip


class ExtensionBlock:
    """The header-extension block of a frame's packets: the sender's map builds it once, and
    each frame only writes its abs-send-time (aiortc's map packs the values, ours unpacks and
    packs them again to add its own: three passes a frame for three changing bytes). Where
    the block changes otherwise than in three bytes, the map builds each frame's."""

    def __init__(self, extensions_map: Any, mid: str | None) -> None:
        self._map = extensions_map
        low = extensions_map.set(HeaderExtensions(abs_send_time=0, mid=mid))
        high = extensions_map.set(HeaderExtensions(abs_send_time=0xFFFFFF, mid=mid))
        changed = [i for i, (a, b) in enumerate(zip(low[1], high[1], strict=False)) if a != b]
        self._offset = changed[0] if changed else None  # where abs-send-time's bytes are
        three = self._offset is None or changed == [self._offset + i for i in range(3)]
        same_shape = low[0] == high[0] and len(low[1]) == len(high[1])
        self._template: tuple[int, bytes] | None = low if same_shape and three else None

    def build(self, extensions: HeaderExtensions) -> tuple[int, bytes]:
        """What `map.set(extensions)` returns, for extensions that differ from the template's
        in abs-send-time alone."""
        template, offset = self._template, self._offset
        if template is None or extensions.abs_send_time is None:
            return cast(tuple[int, bytes], self._map.set(extensions))
        if offset is None:  # the map writes no abs-send-time
            return template
        profile, data = template
        value = extensions.abs_send_time.to_bytes(3, "big")
        return profile, data[:offset] + value + data[offset + 3 :]


class FrameSender:
    """Runs `sender`'s RTP loop frame by frame into `send_frame` (`install` before the sender
    starts, that is before the local description is set)."""

    def __init__(self, sender: Any, send_frame: Callable[[Sequence[bytes]], Awaitable[None]]):
        self._sender = sender
        self._send_frame = send_frame
        self.frames = 0

    def install(self) -> None:
        self._sender._run_rtp = self._run
        self._sender._RTCRtpSender__rtp_history = FrameHistory()

    async def _run(self, codec: RTCRtpCodecParameters) -> None:
        sender = self._sender
        sender._RTCRtpSender__rtp_started.set()
        sequence, origin = rtcrtpsender.random_sequence_number(), random32()
        payload_type = codec.payloadType
        assert payload_type is not None  # the negotiated codec's
        if codec.mimeType.lower() == "video/h264":  # aiortc's packs only when it has none
            sender._RTCRtpSender__encoder = H264Packer()
        # the map and the mid are the negotiation's, fixed while this loop runs
        block = ExtensionBlock(
            sender._RTCRtpSender__rtp_header_extensions_map, sender._RTCRtpSender__mid
        )
        try:
            while True:
                if not sender._RTCRtpSender__track:
                    await asyncio.sleep(0.02)
                    continue
                frame = await sender._next_encoded_frame(codec)
                if frame is None:
                    continue
                await self._send(block, frame.payloads, payload_type, sequence,
                                 uint32_add(origin, frame.timestamp))  # fmt: skip
                sequence = (sequence + len(frame.payloads)) & 0xFFFF
        except (asyncio.CancelledError, ConnectionError, MediaStreamError):
            pass
        except Exception:  # as aiortc's loop: said, and the loop ends so that stop() returns
            log.warning("frame_sender.failed", extra={"error": traceback.format_exc()[-2000:]})
        # freed now, by reference counts: left to die with the peer connection's reference
        # cycles, a second of frames would wait for a full collection (receive_estimator)
        sender._RTCRtpSender__rtp_history.clear()
        track = sender._RTCRtpSender__track
        if track:
            track.stop()
            sender._RTCRtpSender__track = None
        sender._RTCRtpSender__encoder = None
        sender._RTCRtpSender__rtp_exited.set()

    async def _send(
        self,
        block: ExtensionBlock,
        payloads: Sequence[bytes],
        payload_type: int,
        sequence: int,
        timestamp: int,
    ) -> None:
        sender = self._sender
        ntp = ntp_now()
        extensions = HeaderExtensions()  # one for the frame's packets, as aiortc would write
        extensions.abs_send_time = (ntp >> 14) & 0x00FFFFFF
        extensions.mid = sender._RTCRtpSender__mid
        extension = block.build(extensions)
        ssrc, size = sender._ssrc, history_size()
        history = sender._RTCRtpSender__rtp_history
        history.add(sent_frame(sequence, payloads, payload_type, timestamp, ssrc, extensions, size))
        packets = serialize_frame(payloads, payload_type, sequence, timestamp, ssrc, extension)
        await self._send_frame(packets)
        self.frames += 1
        sender._RTCRtpSender__ntp_timestamp = ntp  # the sender report's pair: the frame's
        sender._RTCRtpSender__rtp_timestamp = timestamp
        sender._RTCRtpSender__octet_count += sum(map(len, payloads))
        sender._RTCRtpSender__packet_count += len(payloads)
