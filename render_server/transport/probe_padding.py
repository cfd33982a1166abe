"""The bytes a probe cluster is sent with: copies of the packets just sent.

A congestion controller's probe is a burst at a higher rate than the stream's; libwebrtc fills
it with RTX copies of recent packets ("payload padding"), which the receiver drops as
duplicates but counts in its transport feedback. Checked against aiortc 1.16: the sender's
private `_RTCRtpSender__rtp_history` (keyed by sequence number modulo RTP_HISTORY_SIZE),
`__rtx_payload_type`, `__rtx_sequence_number` (advanced here, as aiortc's retransmissions
do), `_rtx_ssrc` and `__rtp_header_extensions_map`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from aiortc import rtcrtpsender
from aiortc.rtp import wrap_rtx

from render_server.transport.congestion import ProbeCluster
from render_server.transport.fec_path import FecPath

RECENT: Final = 8  # the packets a probe's padding cycles through
PROBE_PACKET: Final = 1100  # bytes a probe may run ahead of its rate: one packet


@dataclass
class ProbeRun:
    """A probe cluster under way: what of it has gone (wire bytes), and since when."""

    cluster: ProbeCluster
    started: float | None = None
    packets: int = 0
    sent: int = 0

    def done(self) -> bool:
        cluster = self.cluster
        return self.packets >= cluster.min_packets and self.sent >= cluster.min_bytes

    def due(self, now: float) -> bool:
        """Another padding packet is due at `now` (the cluster's rate from its first)."""
        if self.started is None:
            self.started = now
        allowed = (now - self.started) * self.cluster.bitrate / 8 + PROBE_PACKET
        return self.sent < allowed and not self.done()

    def count(self, size: int) -> None:
        self.packets, self.sent = self.packets + 1, self.sent + size


def padding_packet(sender: Any, last_sequence: int, index: int) -> bytes | None:
    """The `index`th padding packet after `sender`'s packet `last_sequence` (aiortc's number):
    an RTX copy of one of the RECENT packets up to it, or the packet itself where RTX was not
    negotiated; None where the history holds none of them."""
    history: dict[int, Any] = sender._RTCRtpSender__rtp_history
    size = int(getattr(rtcrtpsender, "RTP_HISTORY_SIZE"))  # noqa: B009 (a module global)
    for step in range(RECENT):
        sequence = (last_sequence - (index + step) % RECENT) & 0xFFFF
        packet = history.get(sequence % size)
        if packet is not None and packet.sequence_number == sequence:
            break
    else:
        return None
    rtx_type = sender._RTCRtpSender__rtx_payload_type
    if rtx_type is not None:
        packet = wrap_rtx(packet, rtx_type, next_rtx_number(sender), sender._rtx_ssrc)
    data: bytes = packet.serialize(sender._RTCRtpSender__rtp_header_extensions_map)
    return data


def wire_padding(
    sender: Any, last_media: int | None, index: int, fec: FecPath | None
) -> bytearray | None:
    """`padding_packet` after aiortc's media packet `last_media`, numbered as the wire knows
    it where `fec` renumbers the stream; None where there is nothing to copy."""
    if last_media is None:
        return None
    data = padding_packet(sender, last_media, index)
    if data is not None and fec is not None:  # aiortc's number → the wire's
        data = fec.retransmission(data)
    return None if data is None else bytearray(data)


def next_rtx_number(sender: Any) -> int:
    """The sender's next RTX sequence number, taken (aiortc's retransmissions take theirs from
    the same counter, so that no two RTX packets share one)."""
    number: int = sender._RTCRtpSender__rtx_sequence_number
    sender._RTCRtpSender__rtx_sequence_number = (number + 1) & 0xFFFF
    return number
