"""The bytes a probe cluster is sent with (copies of the packets just sent), and when.

A congestion controller's probe is a burst at a higher rate than the stream's; libwebrtc fills
it with RTX copies of recent packets ("payload padding"), which the receiver drops as
duplicates but counts in its transport feedback. Checked against aiortc 1.16: the sender's
private `_RTCRtpSender__rtp_history` (keyed by sequence number modulo RTP_HISTORY_SIZE),
`__rtx_payload_type`, `__rtx_sequence_number` (advanced here, as aiortc's retransmissions
do), `_rtx_ssrc` and `__rtp_header_extensions_map`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aiortc import rtcrtpsender
from aiortc.rtp import wrap_rtx

from render_server.transport.congestion import ProbeCluster
from render_server.transport.fec_path import FecPath

RECENT: Final = 8  # the packets a probe's padding cycles through
PROBE_PACKET: Final = 1100  # bytes a probe may run ahead of its rate: one packet
BACKLOG_WAIT_S: Final = 0.1  # the longest a probe waits for the link to clear: 3 frames at 30


@dataclass
class ProbeRun:
    """A probe cluster under way: what of it has gone (wire bytes), since when, and when its
    last packet went."""

    cluster: ProbeCluster
    started: float
    packets: int = 0
    sent: int = 0
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.last = self.started

    def done(self) -> bool:
        """All of the cluster is out, and not sooner than its rate: media the pacer let out
        at 2.5x the estimate filled a 3.7 Mbit/s cluster in 8 ms, and a browser that bunched
        its first packets read it at over twice the rate it was sent, which a probe's
        estimate discards (MAX_VALID_RATIO): the link that came back went unseen for 5 s."""
        cluster = self.cluster
        if self.packets < cluster.min_packets or self.sent < cluster.min_bytes:
            return False
        # padding at the rate may run a packet ahead (`due`), and its last packet may be the one
        # that fills the cluster: two packets' time of slack
        span = (cluster.min_bytes - 2 * PROBE_PACKET) * 8 / cluster.bitrate
        return self.last - self.started >= span

    def due(self, now: float) -> bool:
        """Another padding packet is due at `now` (the cluster's rate from its start)."""
        allowed = (now - self.started) * self.cluster.bitrate / 8 + PROBE_PACKET
        return self.sent < allowed and not self.done()

    def count(self, size: int, now: float) -> None:
        self.packets, self.sent, self.last = self.packets + 1, self.sent + size, now


class LinkBacklog:
    """When what we sent will have crossed the bottleneck, if it carries the estimate. The
    pacer lets a frame out at 2.5× the estimate, so on a narrow link the frame is still
    crossing it after the pacer is done; a probe started then stacks its padding on the frame
    (and the next), where one started after it fills the link's idle time: on a 2 Mbit/s link
    filled to 95 %, a recovery probe put 40 ms on the frames around it."""

    def __init__(self) -> None:
        self._clear_at = 0.0

    def add(
        self, batch: Sequence[bytes | bytearray], overhead: int, now: float, rate: float
    ) -> None:
        size = sum(len(data) + overhead for data in batch)
        self._clear_at = max(self._clear_at, now) + size * 8 / max(rate, 1.0)

    def clear(self, now: float) -> bool:
        return now >= self._clear_at

    def clear_in(self, now: float) -> float:
        return max(0.0, self._clear_at - now)


class Prober:
    """A send path's probe clusters: the one under way, and the padding it is due."""

    def __init__(self, sender: Any, overhead: int) -> None:
        self.sender = sender
        self.overhead = overhead  # the wire's bytes beyond the packet's, as the controller counts
        self.run: ProbeRun | None = None
        self.backlog = LinkBacklog()  # a probe starts once our packets crossed the link...
        self._waiting: tuple[ProbeCluster, float] | None = None  # ...or it waited this long
        self.started = 0
        self._source = 0  # which recent packet the next padding copies

    @property
    def cluster_id(self) -> int | None:
        return self.run.cluster.id if self.run is not None else None

    def begin(self, now: float, next_probe: Callable[[float], ProbeCluster | None]) -> None:
        """Take the controller's next cluster, and start it once the backlog has crossed
        the link, or after `BACKLOG_WAIT_S` at most: a stream that fills its estimate keeps
        a backlog always (after a step up to 20 Mbit/s, an estimate of 1.85 held back every
        recovery probe for 14 s)."""
        if self.run is not None:
            return
        if self._waiting is None:
            cluster = next_probe(now)
            if cluster is None:
                return
            self._waiting = (cluster, now + BACKLOG_WAIT_S)
        cluster, until = self._waiting
        if self.backlog.clear(now) or now >= until:
            self._waiting = None
            self.run = ProbeRun(cluster, now)
            self.started += 1

    def wait(self, now: float) -> float | None:
        """Seconds until the pacer should look again: soon while a probe runs, when the
        backlog clears (or the wait ends) while one waits; None otherwise."""
        if self.run is not None:
            return 0.001
        if self._waiting is not None:
            return min(self.backlog.clear_in(now), max(0.0, self._waiting[1] - now))
        return None

    def sent(self, batch: Sequence[bytes | bytearray], now: float) -> None:
        """Packets the pacer let out during the probe count toward it, as libwebrtc's pacer
        probes with media first and pads only the rest: padding beside a frame doubled the
        burst (a 7 kB probe at 3.75 Mbit/s went out as 13.5 kB, 40 ms more on a 2 Mbit/s
        link)."""
        run = self.run
        if run is None:
            return
        for data in batch:
            run.count(len(data) + self.overhead, now)
        if run.done():
            self.run = None

    def padding(self, now: float, last_media: int | None, fec: FecPath | None) -> list[bytearray]:
        """The padding due at `now`, at the cluster's rate; the probe ends once it is all out
        (or when there is nothing to copy yet: no probe)."""
        run, batch = self.run, list[bytearray]()
        assert run is not None
        while run.due(now):
            padding = wire_padding(self.sender, last_media, self._source, fec)
            self._source += 1
            if padding is None:
                self.run = None
                return batch
            batch.append(padding)
            run.count(len(padding) + self.overhead, now)
        if run.done():
            self.run = None
        return batch


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
