"""What the paced send path negotiates beyond aiortc's own: transport-cc (the header
extension and the RTCP feedback on every video codec) and forward error correction (RED, its
RTX, ULPFEC), and reading the latter's payload types back from an answer.

Process-wide, as aiortc keeps one list of codecs and header extensions; idempotent; called
by `video_sender` at import. Checked against aiortc 1.16: `aiortc.codecs.CODECS`, the
codecs' `rtcpFeedback` lists, and the module globals `PACKET_MAX` of `aiortc.codecs.h264`
and `aiortc.codecs.vpx`.
"""

from __future__ import annotations

from aiortc import codecs
from aiortc.codecs import h264, vpx
from aiortc.rtcrtpparameters import RTCRtcpFeedback, RTCRtpCodecParameters
from aiortc.rtp import DYNAMIC_PAYLOAD_TYPES
from aiortc.sdp import SessionDescription

from render_server.transport.av1_codec import PAYLOAD_MAX
from render_server.transport.fec_path import FecPayloadTypes
from render_server.transport.header_extensions import TRANSPORT_CC_URI
from render_server.transport.playout_delay import register_video_extension


def register_fec_codecs() -> None:
    """Let answers carry RED (with its RTX) and ULPFEC for video, which browsers offer
    (process-wide, idempotent). A sender uses them only where `codec_preferences` asked
    for them and the path then protects frames (`fec_path`).

    A ULPFEC packet carries a media packet's header twice over (its own and the protected
    one's) plus 19 bytes: with aiortc's 1300-byte H.264 and VP8 payloads it outgrows what
    pylibsrtp protects (1356 bytes), so payloads are held to PAYLOAD_MAX, as our AV1's."""
    for module in (h264, vpx):
        setattr(module, "PACKET_MAX", PAYLOAD_MAX)  # noqa: B010 (a module global aiortc reads)
    video = codecs.CODECS["video"]
    if any(c.mimeType.lower() == "video/red" for c in video):
        return
    used = {c.payloadType for kind in codecs.CODECS.values() for c in kind}
    red, rtx, ulpfec = [pt for pt in DYNAMIC_PAYLOAD_TYPES if pt not in used][:3]
    video += [
        RTCRtpCodecParameters(mimeType="video/red", clockRate=90000, payloadType=red),
        RTCRtpCodecParameters(
            mimeType="video/rtx", clockRate=90000, payloadType=rtx, parameters={"apt": red}
        ),  # fmt: skip
        RTCRtpCodecParameters(mimeType="video/ulpfec", clockRate=90000, payloadType=ulpfec),
    ]


def fec_payload_types(sdp: str) -> FecPayloadTypes | None:
    """The media codec's (the first), RED's, ULPFEC's and RED's RTX payload types in an
    answer's video section, where it has RED and ULPFEC; else None."""
    try:
        description = SessionDescription.parse(sdp)
    except Exception:  # aiortc's parser raises whatever a malformed line makes it raise
        return None
    for media in description.media:
        if media.kind != "video":
            continue
        by_name = {c.name.lower(): c.payloadType for c in media.rtp.codecs if c.name != "rtx"}
        red, ulpfec = by_name.get("red"), by_name.get("ulpfec")
        media_pt = media.rtp.codecs[0].payloadType if media.rtp.codecs else None
        if red is None or ulpfec is None or media_pt is None:
            return None
        rtx_red = next((c.payloadType for c in media.rtp.codecs
                        if c.name == "rtx" and c.parameters.get("apt") == red), None)  # fmt: skip
        in_order = media.rtp.codecs[0].name.lower() == "h264"  # its packet buffer holds frames
        return FecPayloadTypes(media_pt, red, ulpfec, rtx_red, in_order)
    return None


def register_transport_cc() -> None:
    """Offer and answer transport-cc for video: the header extension and the `transport-cc`
    RTCP feedback on every video codec (process-wide, as aiortc keeps one list). Idempotent;
    after the codecs are registered (AV1)."""
    register_video_extension(TRANSPORT_CC_URI)
    feedback = RTCRtcpFeedback(type="transport-cc")
    for codec in codecs.CODECS["video"]:
        if codec.name != "rtx" and feedback not in codec.rtcpFeedback:
            codec.rtcpFeedback.append(feedback)
