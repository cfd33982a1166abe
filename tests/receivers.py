"""A recvonly video receiver with H.264 (payload type 96) and its RTX (97) negotiated, as the
lean and counting receivers' tests feed it crafted packets."""

from __future__ import annotations

from typing import Any

from aiortc import RTCPeerConnection, RTCRtpCodecParameters

H264, RTX = 96, 97


def h264_receiver(pc: RTCPeerConnection) -> Any:
    receiver = pc.addTransceiver("video", direction="recvonly").receiver
    codecs = receiver._RTCRtpReceiver__codecs  # type: ignore[attr-defined]
    codecs[H264] = RTCRtpCodecParameters("video/H264", 90000, payloadType=H264)
    codecs[RTX] = RTCRtpCodecParameters("video/rtx", 90000, payloadType=RTX,
                                        parameters={"apt": H264})  # fmt: skip
    return receiver
