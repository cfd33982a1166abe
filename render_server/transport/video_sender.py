"""A session's video sender on an aiortc peer connection: H.264 only, the browser's RTCP
feedback routed to our encoder, and the playout delay asked for.

Patches nothing itself; the modules it calls were checked against aiortc 1.16 (see
`render_server.transport`).
"""

from __future__ import annotations

from collections.abc import Callable

from aiortc import RTCPeerConnection, RTCRtpSender, RTCRtpTransceiver
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtcrtpparameters import RTCRtpCodecCapability

from render_server.transport.playout_delay import register_playout_delay, request_playout_delay
from render_server.transport.rtcp_feedback import route_rtcp_feedback

# At import, for the whole process (aiortc keeps one list of header extensions): every peer
# connection made here negotiates playout delay, the tools' aiortc clients too; a sender writes
# it only where `request_playout_delay` asked for it.
register_playout_delay()


def h264_codec_preferences() -> list[RTCRtpCodecCapability]:
    """H.264 (and its RTX) only: the project's encoder makes H.264, aiortc must not pick VP8."""
    codecs = RTCRtpSender.getCapabilities("video").codecs
    return [c for c in codecs if c.mimeType.lower() in ("video/h264", "video/rtx")]


def add_video_sender(
    pc: RTCPeerConnection,
    track: MediaStreamTrack,
    playout_delay: str,
    on_keyframe_request: Callable[[], None],
    on_receiver_estimate: Callable[[int], None],
) -> RTCRtpTransceiver:
    """Send `track` (already-encoded H.264) on `pc`, before its offer is applied: PLI/FIR call
    `on_keyframe_request`, REMB `on_receiver_estimate(bits per second)`."""
    transceiver = pc.addTransceiver(track, direction="sendonly")
    transceiver.setCodecPreferences(h264_codec_preferences())
    route_rtcp_feedback(transceiver.sender, on_keyframe_request, on_receiver_estimate)
    request_playout_delay(transceiver.sender, playout_delay)
    return transceiver
