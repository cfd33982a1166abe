"""A session's video sender on an aiortc peer connection: the one codec the session sends, the
browser's RTCP feedback routed to our encoder, and the playout delay asked for.

Patches nothing itself; the modules it calls were checked against aiortc 1.16 (see
`render_server.transport`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiortc import RTCPeerConnection, RTCRtpSender, RTCRtpTransceiver
from aiortc.codecs import CODECS
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcpeerconnection import find_common_codecs
from aiortc.rtcrtpparameters import RTCRtpCodecCapability
from aiortc.sdp import SessionDescription

from render_server.transport.av1_codec import register_av1
from render_server.transport.paced_negotiation import register_fec_codecs, register_transport_cc
from render_server.transport.playout_delay import register_playout_delay, request_playout_delay
from render_server.transport.receive_estimator import drop_receive_estimator
from render_server.transport.rtcp_feedback import route_rtcp_feedback

# At import, for the whole process (aiortc keeps one list of codecs and of header extensions):
# every peer connection made here negotiates AV1 and playout delay, the tools' aiortc clients
# too; a sender writes the playout delay only where `request_playout_delay` asked for it.
register_av1()
register_fec_codecs()
register_playout_delay()
register_transport_cc()


def offered_codecs(sdp: str) -> list[str]:
    """The video codecs of an offer that this aiortc can packetize, in the offer's order (the
    browser's preference), by RTP name: an H.264 of a profile or packetization aiortc does not
    speak (Main, mode 0) is left out, as are RTX, RED and FEC. Empty where the SDP does not
    parse or has no video."""
    try:
        description = SessionDescription.parse(sdp)
    except Exception:  # aiortc's parser raises whatever a malformed line makes it raise
        return []
    names: list[str] = []
    for media in description.media:
        if media.kind == "video":
            for codec in find_common_codecs(CODECS["video"], media.rtp.codecs):
                if codec.name != "rtx" and codec.name not in names:
                    names.append(codec.name)
    return names


def decoder_limits(sdp: str, codec: str) -> tuple[int | None, float | None]:
    """What the offer's decoder of `codec` takes at most: frame size in macroblocks and frame
    rate (RFC 7741's `max-fs`, `max-fr`, which Firefox states for VP8), None where unsaid. With
    several entries of the codec, the loosest counts (the answer may pick any)."""
    try:
        description = SessionDescription.parse(sdp)
    except Exception:
        return None, None
    sizes: list[float | None] = []
    rates: list[float | None] = []
    for media in description.media:
        if media.kind != "video":
            continue
        for entry in media.rtp.codecs:
            if entry.name.upper() == codec.upper():
                sizes.append(_positive(entry.parameters.get("max-fs")))
                rates.append(_positive(entry.parameters.get("max-fr")))
    size = None if not sizes or None in sizes else int(max(s for s in sizes if s is not None))
    rate = None if not rates or None in rates else max(r for r in rates if r is not None)
    return size, rate


def _positive(value: object) -> float | None:
    try:
        number = float(str(value))
    except ValueError:
        return None
    return number if number > 0 else None


def codec_preferences(*codecs: str, fec: bool = False) -> list[RTCRtpCodecCapability]:
    """`codecs` (RTP names, "H264"), in that order, and RTX: what our encoders make, and
    nothing aiortc would pick on its own; with `fec`, RED and ULPFEC after them (the paced
    send path's forward error correction, `fec_path`)."""
    capabilities = RTCRtpSender.getCapabilities("video").codecs
    extra = ["video/red", "video/ulpfec"] if fec else []
    wanted = [f"video/{codec}".lower() for codec in codecs] + extra + ["video/rtx"]
    return [c for mime in wanted for c in capabilities if c.mimeType.lower() == mime]


def add_video_sender(
    pc: RTCPeerConnection,
    track: MediaStreamTrack,
    playout_delay: str,
    on_keyframe_request: Callable[[], None],
    on_receiver_estimate: Callable[[int], None],
    codec: str = "H264",
    transport_cc: bool = False,
    fec: bool = False,
) -> RTCRtpTransceiver:
    """Send `track` (already encoded in `codec`) on `pc`, before its offer is applied: PLI/FIR
    call `on_keyframe_request`, REMB `on_receiver_estimate(bits per second)`; with
    `transport_cc` every packet carries the transport-wide sequence number placeholder that
    `send_path.SendPath` numbers; with `fec` the answer takes RED and ULPFEC where offered."""
    transceiver = pc.addTransceiver(track, direction="sendonly")
    drop_receive_estimator(transceiver.receiver)
    transceiver.setCodecPreferences(codec_preferences(codec, fec=fec))
    route_rtcp_feedback(transceiver.sender, on_keyframe_request, on_receiver_estimate)
    request_playout_delay(transceiver.sender, playout_delay, transport_cc)
    return transceiver
