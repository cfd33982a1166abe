"""Carries the browser's RTCP feedback to the project's encoder: keyframe requests and REMB.

On the pre-encoded path aiortc acts on neither: PLI and FIR become
`RTCRtpSender._send_keyframe()`, which only sets a flag its own encoder reads, and REMB sets the
bitrate of aiortc's encoder, which never runs here. We wrap the two methods on the one sender
instance so that each request also reaches our callbacks.

Checked against aiortc 1.16: the private `RTCRtpSender._send_keyframe`, `_handle_rtcp_packet`
and `_ssrc`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpSender
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, unpack_remb_fci


def route_rtcp_feedback(
    sender: RTCRtpSender,
    on_keyframe: Callable[[], None],
    on_bitrate: Callable[[int], None],
) -> None:
    send_keyframe = getattr(sender, "_send_keyframe", None)
    handle_rtcp = getattr(sender, "_handle_rtcp_packet", None)
    if not callable(send_keyframe) or not callable(handle_rtcp):
        raise RuntimeError("this aiortc's RTCRtpSender has no RTCP hooks to route feedback from")

    def keyframe_requested() -> None:
        on_keyframe()
        send_keyframe()

    async def handle(packet: Any) -> None:
        if isinstance(packet, RtcpPsfbPacket) and packet.fmt == RTCP_PSFB_APP:
            try:
                bitrate, ssrcs = unpack_remb_fci(packet.fci)
            except ValueError:
                pass  # an application-layer feedback that is not REMB
            else:
                if sender._ssrc in ssrcs:
                    on_bitrate(bitrate)
        await handle_rtcp(packet)

    sender._send_keyframe = keyframe_requested  # type: ignore[method-assign]
    sender._handle_rtcp_packet = handle  # type: ignore[method-assign]
