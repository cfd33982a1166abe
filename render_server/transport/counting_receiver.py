"""A receiver that counts what a server sends without unprotecting it: a sink for capacity runs.

SRTP encrypts an RTP packet's payload, not its header: sequence number, timestamp, marker bit
and payload type stay in the clear. `CountingReceiver` reads them where the socket receives
them, a coalesced run (`udp_gro`) at a time, and reports each frame as its marker packet comes
(the RTP timestamp, packets and datagram bytes since the previous marker). Nothing else is
authenticated, decrypted, reassembled or decoded, but for the frames a `FrameSampler` asks for:
while it wants one, the first packet of each frame is unprotected and shown to it, and where it
takes the frame (a keyframe, to decode), so is every packet up to the frame's marker. That
proves the picture now and then, as the lean receiver's sampled decode does, at the price of
one unprotect per frame while a sample is due; `LeanReceiver` authenticates every packet.

With `transport_feedback`, every RTP datagram's transport-wide number (a header extension, also
in the clear: SRTP leaves header extensions unencrypted) and the read's arrival go to the
feedback generator, as in `LeanReceiver`, so a counting harness reports every packet as a
browser does and the worker paces and estimates the path as for browsers.

Its use is to take the harness off the CPU a server is measured on: counting a 4K60 frame
costs one read and a loop over its datagrams' first bytes, against an unprotect and a header
parse per datagram for the lean receiver. STUN, DTLS, RTCP, and SRTP that comes before the
keys, go to aiortc as before, so ICE consent and the DTLS session stay alive.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, Final, Protocol

import pylibsrtp
from aiortc.rtcdtlstransport import State
from aiortc.rtcrtpreceiver import RTCRtpReceiver, StreamStatistics

from render_server.transport.header_extensions import read_transport_sequence
from render_server.transport.lean_receiver import LeanReceiver, SeenPacket, payload_bounds

# (RTP timestamp, media packets, their datagram bytes, arrival ms on time.monotonic(): the
# kernel's receive time where the read carried one, see `udp_gro.ReadClock`)
FrameCounted = Callable[[int, int, int, float], None]

_HEADER: Final = struct.Struct("!HII")  # sequence number, timestamp, SSRC
_TIMESTAMP: Final = struct.Struct("!I")
RTP_HEADER: Final = 12


def _ignore(*_: Any) -> None:
    pass


class FrameSampler(Protocol):
    """Which frames `CountingReceiver` unprotects and hands on whole (their payloads)."""

    def wants(self) -> bool:
        """A sample is due: show me the first packet of each frame until I take one."""
        ...

    def begin(self, payload: bytes) -> bool:
        """A frame's first packet's payload: True to take the frame (its packets follow,
        this one included, through `add`)."""
        ...

    def add(self, seq: int, timestamp: int, marker: int, payload: bytes, arrival_ms: float) -> None:
        """A packet of the frame taken (the receiver hook's `on_packet` signature)."""
        ...

    def end(self) -> None:
        """The frame taken is over: its marker came, or a packet of it did not unprotect."""
        ...


class CountingReceiver(LeanReceiver):
    """Takes one receiver's video off aiortc's path and counts it (see the module). Create it
    right after `addTransceiver`; call `rehook` after negotiating, as for `LeanReceiver`.

    `stats.direct` counts the SRTP datagrams counted here, `stats.packets` those of the
    media's payload types, `repairs` the others (RTX: retransmissions and probe padding, or
    a payload type not negotiated); `stats.unprotect_failed` the sampled packets SRTP
    refused, `unprotected` those it took."""

    def __init__(
        self,
        receiver: RTCRtpReceiver,
        on_frame: FrameCounted,
        sampler: FrameSampler | None = None,
        transport_feedback: bool = False,
    ) -> None:
        self.on_frame = on_frame
        self.sampler = sampler
        self.repairs = 0
        self.unprotected = 0
        self._packets = 0  # of the frame under way, since the last marker
        self._bytes = 0
        self._sampling = False  # the frame under way is the sampler's
        super().__init__(receiver, _ignore, transport_feedback=transport_feedback)

    @property
    def lost_packets(self) -> int:
        """Media packets lost so far, as the receiver reports tell the sender (sequence
        numbers never seen)."""
        return sum(stream.packets_lost for stream in self._streams.values())

    def _readers(
        self, dtls: Any, original: Callable[[Any, Any], None], aiortcs: Callable[..., Any]
    ) -> tuple[Callable[[Any, Any], None], Callable[[bytes, int, Any], int] | None]:
        take = self._taker(dtls)

        def counted(data: Any, addr: Any) -> None:
            if not take(data, 0, addr):
                original(data, addr)

        counted.lean = True  # type: ignore[attr-defined]
        return counted, take

    def _taker(self, dtls: Any) -> Callable[[bytes, int, Any], int]:
        codecs, stats, streams, sampler = self._codecs, self.stats, self._streams, self.sampler
        clock = self.clock
        rates: dict[int, int] = {}  # payload type → the media's clock rate, 0 for RTX

        def rate_of(payload_type: int) -> int:
            """The clock rate of a media payload type, 0 for RTX, −1 for one not negotiated
            (not kept: a negotiation may add it)."""
            codec = codecs.get(payload_type)
            if codec is None:
                return -1
            rate = rates[payload_type] = 0 if codec.name.lower() == "rtx" else codec.clockRate
            return rate

        def take(run: bytes, segment: int, addr: Any) -> int:
            """Count `run` (datagrams of `segment` bytes, the last may be shorter) where
            every datagram in it is keyed SRTP: how many, else 0 (left to aiortc)."""
            if dtls._rx_srtp is None or dtls._state != State.CONNECTED:
                return 0
            size = len(run)
            step = segment if segment > 0 else size
            if size < RTP_HEADER:
                return 0
            starts = range(0, size, step)
            for start in starts:
                if size - start < RTP_HEADER or not 127 < run[start] < 192:
                    return 0  # short, or not RTP version 2
                if 192 <= run[start + 1] <= 208:
                    return 0  # RTCP (aiortc's `is_rtcp`)
            now = clock.now_ms()
            if self.feedback is not None:
                self._report(run, starts, step, int(now * 1000))
            packets, sent = self._packets, self._bytes  # of the frame under way
            media, first, last, clock_rate = 0, -1, -1, 0
            for start in starts:
                second = run[start + 1]
                rate = rates.get(second & 0x7F)
                if rate is None:
                    rate = rate_of(second & 0x7F)
                if rate <= 0:
                    continue
                media += 1
                if sampler is not None and (self._sampling or packets == 0 and sampler.wants()):
                    self._sample(dtls, run[start : start + step], now, packets == 0)
                packets += 1
                sent += step if start + step <= size else size - start
                last, clock_rate = start, rate
                first = start if first < 0 else first
                if second & 0x80:
                    if self._sampling:
                        self._end_sample()
                    self.on_frame(_TIMESTAMP.unpack_from(run, start + 4)[0], packets, sent, now)
                    packets = sent = 0
            self._packets, self._bytes = packets, sent
            count = len(starts)
            self.repairs += count - media
            if last >= 0:  # one stream per media payload type: its last packet stands for all
                seq, timestamp, ssrc = _HEADER.unpack_from(run, last + 2)
                statistics = streams.get(ssrc)
                if statistics is None:
                    statistics = streams[ssrc] = StreamStatistics(clock_rate)
                behind = media - 1  # packets before the last
                if statistics.base_seq is None and first != last:  # the stream starts here
                    start_seq, start_timestamp, _ = _HEADER.unpack_from(run, first + 2)
                    statistics.add(SeenPacket(start_seq, start_timestamp))  # type: ignore[arg-type]
                    behind -= 1
                statistics.add(SeenPacket(seq, timestamp))  # type: ignore[arg-type]
                statistics.packets_received += behind
            stats.direct += count
            stats.packets += media
            dtls._RTCDtlsTransport__rx_bytes += size
            dtls._RTCDtlsTransport__rx_packets += count
            return count

        return take

    def _report(self, run: bytes, starts: range, step: int, arrival_us: int) -> None:
        """Each datagram's transport-wide number, read in place from its header extension in
        the clear, to the feedback generator (`arrival_us`: the read's)."""
        extension_id = self._feedback_extension()
        if extension_id is None or self.feedback is None:
            return
        on_packet, view = self.feedback.generator.on_packet, memoryview(run)
        for start in starts:
            number = read_transport_sequence(view[start : start + step], extension_id)
            if number is not None:
                on_packet(number, arrival_us, _HEADER.unpack_from(run, start + 2)[2])

    def _sample(self, dtls: Any, datagram: bytes, arrival_ms: float, first: bool) -> None:
        """Unprotect a datagram of a frame the sampler wants or may want (`first`: the frame's
        first packet, which decides) and hand it on."""
        sampler = self.sampler
        assert sampler is not None
        try:
            plain = dtls._rx_srtp.unprotect(datagram)
        except pylibsrtp.Error:
            self.stats.unprotect_failed += 1
            if self._sampling:
                self._end_sample()  # the frame cannot be whole
            return
        self.unprotected += 1
        bounds = payload_bounds(plain)
        if bounds is None:
            return
        payload = plain[bounds[0] : bounds[1]]
        if first:
            self._sampling = sampler.begin(payload)
        if self._sampling:
            seq, timestamp, _ = _HEADER.unpack_from(plain, 2)
            sampler.add(seq, timestamp, plain[1] >> 7, payload, arrival_ms)

    def _end_sample(self) -> None:
        self._sampling = False
        if self.sampler is not None:
            self.sampler.end()
