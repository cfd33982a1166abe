"""A page's trickled ICE candidate, handed to an aiortc peer connection."""

from __future__ import annotations

from aiortc import RTCPeerConnection
from aiortc.sdp import candidate_from_sdp

from render_server.protocol.signaling import IceCandidate


async def add_candidate(pc: RTCPeerConnection, message: IceCandidate) -> None:
    """Add the candidate (an empty one: the end of candidates); ValueError for a line aiortc
    cannot use (it asserts on a short line, raises ValueError on an unknown section)."""
    if not message.candidate:
        await pc.addIceCandidate(None)
        return
    text = message.candidate.removeprefix("a=").removeprefix("candidate:")
    try:
        candidate = candidate_from_sdp(text)
        candidate.sdpMid = message.sdp_mid
        candidate.sdpMLineIndex = message.sdp_mline_index
        await pc.addIceCandidate(candidate)
    except (AssertionError, ValueError, IndexError) as exc:
        raise ValueError(f"unusable ICE candidate: {exc}") from exc
