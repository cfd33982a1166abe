"""A hook on aiortc's RTP receiver: every video packet, with its arrival time, before aiortc.

Checked against aiortc 1.16 (see transport/__init__.py): it replaces the receiver's private
`_handle_rtp_packet` and, optionally, its private decoder queue. aiortc's own handling still runs
unchanged after the hook (NACK, REMB, RTCP receiver reports, PLI on loss). The measuring clients
and the load test use it to time frames on their marker bit instead of at `track.recv()`, which
aiortc delays by a whole frame interval.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpReceiver
from aiortc.rtp import RtpPacket, unwrap_rtx

# (sequence number, RTP timestamp, marker bit, payload, arrival on the monotonic clock in ms)
PacketObserver = Callable[[int, int, int, bytes, float], None]
# the codec's name as in SDP ("H264", "VP8", "AV1")
CodecObserver = Callable[[str], None]


class _DiscardQueue(queue.Queue[Any]):
    """Stands in for aiortc's decoder queue: drops encoded frames, passes the stop signal."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if item is None:
            super().put(item, block, timeout)


def observe_receiver(
    receiver: RTCRtpReceiver,
    on_packet: PacketObserver,
    decode_in_aiortc: bool = False,
    on_codec: CodecObserver | None = None,
) -> None:
    """Call `on_packet` for every RTP packet of whichever video codec was negotiated that
    `receiver` gets, before aiortc handles it, and `on_codec` with that codec's name before
    its first packet and again whenever the packets' codec changes (a renegotiation).

    Retransmissions (RTX) are unwrapped to the packet they repair. With `decode_in_aiortc`
    False, aiortc's decoder thread gets no frames: its input queue is swapped, before
    `receive()` starts the thread, for one that keeps only the stop signal, so the track never
    yields a frame and no CPU goes to decoding. Call it right after `addTransceiver`.
    """
    handle = getattr(receiver, "_handle_rtp_packet", None)
    if not callable(handle) or not hasattr(receiver, "_RTCRtpReceiver__decoder_queue"):
        raise RuntimeError("this aiortc's RTCRtpReceiver has no packet hook to observe")
    if not decode_in_aiortc:
        if getattr(receiver, "_RTCRtpReceiver__decoder_thread", None) is not None:
            raise RuntimeError("the receiver already decodes: observe it before negotiating")
        receiver._RTCRtpReceiver__decoder_queue = _DiscardQueue()
    codecs: dict[int, Any] = receiver._RTCRtpReceiver__codecs  # type: ignore[attr-defined]
    rtx_ssrc: dict[int, int] = receiver._RTCRtpReceiver__rtx_ssrc  # type: ignore[attr-defined]
    monotonic = time.monotonic
    told: str | None = None  # the codec `on_codec` last heard of

    def deliver(codec: str, packet: RtpPacket, now: float) -> None:
        nonlocal told
        if on_codec is not None and codec != told:
            told = codec
            on_codec(codec)
        on_packet(packet.sequence_number, packet.timestamp, packet.marker, packet.payload, now)

    async def observed(packet: RtpPacket, arrival_time_ms: int) -> None:
        now = monotonic() * 1000.0
        codec = codecs.get(packet.payload_type)
        if codec is not None:
            if codec.name.lower() != "rtx":
                deliver(codec.name, packet, now)
            else:
                apt = codec.parameters.get("apt")
                original = rtx_ssrc.get(packet.ssrc)
                repaired = codecs.get(apt) if isinstance(apt, int) else None
                if repaired is not None and original is not None and len(packet.payload) >= 2:
                    deliver(repaired.name, unwrap_rtx(packet, payload_type=apt, ssrc=original), now)
        await handle(packet, arrival_time_ms)

    receiver._handle_rtp_packet = observed  # type: ignore[method-assign]
