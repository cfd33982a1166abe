"""AV1 in aiortc: negotiated, packed from pre-encoded packets, received and decoded.

aiortc 1.16 knows VP8 and H.264 only. `register_av1` adds AV1 the way aiortc's `init_codecs`
adds those, and replaces five private names (checked against aiortc 1.16, see
transport/__init__.py):

- `aiortc.codecs.CODECS["video"]`: `video/AV1` and its `video/rtx` appended, after VP8 and
  H.264, on free dynamic payload types, with Chromium's fmtp (profile 0, Main: what we send).
- `aiortc.rtp.DYNAMIC_PAYLOAD_TYPES`: 96-127 in aiortc, whose answer takes the offer's
  payload type only from there and otherwise answers its own (and drops the RTX). Chromium
  puts AV1 on 45 and 47 (libwebrtc uses 35-63 once 96-127 are full), which aiortc would
  answer as 103, a payload type Chromium never offered; 35-63 are dynamic now too.
- `aiortc.rtcpeerconnection.is_codec_compatible`: aiortc matches AV1 on its name and clock
  rate alone, so Chromium's profile-1 (High) entry would be answered as ours; AV1 entries must
  now have the same profile (absent means 0, as the payload format says), like libwebrtc.
- `aiortc.rtcrtpsender.get_encoder`: for AV1 a packer whose `pack` makes the payloads with
  `av1_rtp.packetize_av1` (the pre-encoded path, `RTCRtpSender._next_encoded_frame`).
- `aiortc.rtcrtpreceiver.depayload` and `.get_decoder`: aiortc's jitter buffer joins the
  `depayload` results of a frame's packets into one byte string, which loses the packet
  boundaries an AV1 frame needs; each payload is kept whole behind a 4-byte length, and the
  decoder splits them again, `depacketize_av1`s them and decodes with libdav1d.

The names are looked up at call time in those modules (they import them by name), so the
replacements take effect for peer connections already made too. Other codecs go to aiortc's
own functions unchanged.
"""

from __future__ import annotations

import errno
import logging
from typing import Any, Final, cast

import av
from aiortc import codecs, rtcpeerconnection, rtcrtpreceiver, rtcrtpsender, rtp
from aiortc.codecs.base import Decoder, Encoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import VIDEO_TIME_BASE, convert_timebase
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecParameters
from av.frame import Frame
from av.video.codeccontext import VideoCodecContext

from render_server.transport.av1_rtp import depacketize_av1, packetize_av1

log = logging.getLogger(__name__)

AV1_MIME: Final = "video/AV1"
CLOCK_RATE: Final = 90000
# Chromium's fmtp, which is also the payload format's default: Main profile, level 3.1, Main
# tier. The level is the one a receiver claims to decode; browsers offer 5 and decode 4K.
AV1_PARAMETERS: Final = {"level-idx": 5, "profile": 0, "tier": 0}
DYNAMIC_PAYLOAD_TYPES: Final = range(96, 128)  # where ours go, as aiortc's
# what an offer may use: RFC 3551 leaves 35-63 unassigned and libwebrtc takes them as dynamic
OFFERED_DYNAMIC_PAYLOAD_TYPES: Final = frozenset(range(35, 64)) | frozenset(range(96, 128))
PAYLOAD_MAX: Final = 1200  # as aiortc's H.264 and VP8 packers: room for headers below the MTU
LENGTH_BYTES: Final = 4  # the prefix `depayload` keeps each payload behind


def register_av1() -> None:
    """Let every aiortc peer connection of this process offer, answer, send and receive AV1.
    Idempotent."""
    video = codecs.CODECS["video"]
    if not any(c.mimeType.lower() == AV1_MIME.lower() for c in video):
        used = {c.payloadType for kind in codecs.CODECS.values() for c in kind}
        free = [pt for pt in DYNAMIC_PAYLOAD_TYPES if pt not in used]
        if len(free) < 2:
            raise RuntimeError("no two free dynamic payload types left for AV1 and its RTX")
        pt, rtx = free[:2]
        video += [
            RTCRtpCodecParameters(
                mimeType=AV1_MIME,
                clockRate=CLOCK_RATE,
                payloadType=pt,
                rtcpFeedback=[
                    RTCRtcpFeedback(type="nack"),
                    RTCRtcpFeedback(type="nack", parameter="pli"),
                    RTCRtcpFeedback(type="goog-remb"),
                ],
                parameters=dict(AV1_PARAMETERS),
            ),
            RTCRtpCodecParameters(
                mimeType="video/rtx", clockRate=CLOCK_RATE, payloadType=rtx, parameters={"apt": pt}
            ),
        ]
    _patch(rtp, "DYNAMIC_PAYLOAD_TYPES", OFFERED_DYNAMIC_PAYLOAD_TYPES)
    _patch(rtcpeerconnection, "is_codec_compatible", _is_codec_compatible)
    _patch(rtcrtpsender, "get_encoder", _get_encoder)
    _patch(rtcrtpreceiver, "get_decoder", _get_decoder)
    _patch(rtcrtpreceiver, "depayload", _depayload)


_ORIGINALS: dict[tuple[str, str], Any] = {}


def _patch(module: Any, name: str, replacement: Any) -> None:
    """Put `replacement` in `module.name` once, keeping the original (which the replacements
    call for other codecs)."""
    key = (module.__name__, name)
    if key not in _ORIGINALS:
        _ORIGINALS[key] = getattr(module, name)
        setattr(module, name, replacement)


def _original(module: Any, name: str) -> Any:
    return _ORIGINALS[(module.__name__, name)]


def _is_av1(codec: RTCRtpCodecParameters) -> bool:
    return codec.mimeType.lower() == AV1_MIME.lower()


# -- negotiation -------------------------------------------------------------------------------


def _av1_profile(codec: RTCRtpCodecParameters) -> int:
    return int(str(codec.parameters.get("profile", 0)))


def _is_codec_compatible(a: RTCRtpCodecParameters, b: RTCRtpCodecParameters) -> bool:
    compatible = bool(_original(rtcpeerconnection, "is_codec_compatible")(a, b))
    if compatible and _is_av1(a) and _is_av1(b):
        try:
            return _av1_profile(a) == _av1_profile(b)
        except ValueError:  # a profile that is no number: not ours
            return False
    return compatible


# -- sending -----------------------------------------------------------------------------------


class Av1Packer(Encoder):
    """Packs pre-encoded AV1 temporal units (`av.Packet`s with pts and time_base) into RTP
    payloads. It encodes nothing: the project's encoders run elsewhere, and an AV1 encoder in
    aiortc's sender thread would not keep up with a real-time stream."""

    def encode(self, frame: Frame, force_keyframe: bool = False) -> tuple[list[bytes], int]:
        raise NotImplementedError("AV1 is sent pre-encoded only: the track must yield av.Packet")

    def pack(self, packet: av.Packet[Any]) -> tuple[list[bytes], int]:
        assert packet.pts is not None and packet.time_base is not None
        timestamp = convert_timebase(packet.pts, packet.time_base, VIDEO_TIME_BASE)
        return packetize_av1(bytes(packet), PAYLOAD_MAX), timestamp


def _get_encoder(codec: RTCRtpCodecParameters) -> Encoder:
    if _is_av1(codec):
        return Av1Packer()
    return cast(Encoder, _original(rtcrtpsender, "get_encoder")(codec))


# -- receiving ---------------------------------------------------------------------------------


def _depayload(codec: RTCRtpCodecParameters, payload: bytes) -> bytes:
    if _is_av1(codec):
        return len(payload).to_bytes(LENGTH_BYTES, "big") + payload
    return cast(bytes, _original(rtcrtpreceiver, "depayload")(codec, payload))


def split_payloads(data: bytes) -> list[bytes]:
    """The RTP payloads of one frame from the jitter buffer's join of `_depayload` results."""
    payloads, pos = [], 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + LENGTH_BYTES], "big")
        pos += LENGTH_BYTES
        if pos + size > len(data):
            raise ValueError("a frame's AV1 payloads are cut short")
        payloads.append(data[pos : pos + size])
        pos += size
    return payloads


class Av1Decoder(Decoder):
    """aiortc's decoder interface over libdav1d, as its H264Decoder and Vp8Decoder are over
    FFmpeg's. A frame that does not depacketize raises `av.InvalidDataError`, the error aiortc's
    decoder thread expects: it logs it and asks the sender for a keyframe (PLI)."""

    def __init__(self) -> None:
        self.codec = cast(VideoCodecContext, av.CodecContext.create("libdav1d", "r"))
        # dav1d holds pictures back to decode frames in parallel; a live stream wants each
        # picture out of the call that decoded it
        self.codec.options = {"max_frame_delay": "1"}

    def decode(self, encoded_frame: JitterFrame) -> list[Frame]:
        try:
            unit = depacketize_av1(split_payloads(encoded_frame.data))
        except ValueError as exc:
            raise av.InvalidDataError(errno.EINVAL, f"AV1 RTP payloads: {exc}") from None
        packet = av.Packet(unit)
        packet.pts = encoded_frame.timestamp
        packet.time_base = VIDEO_TIME_BASE
        return cast(list[Frame], self.codec.decode(packet))


def _get_decoder(codec: RTCRtpCodecParameters) -> Decoder:
    if _is_av1(codec):
        return Av1Decoder()
    return cast(Decoder, _original(rtcrtpreceiver, "get_decoder")(codec))
