"""Transport-wide congestion control feedback (RTCP RTPFB, FMT=15): the wire format.

draft-holmer-rmcat-transport-wide-cc-extensions-01 §3.1, encoded and decoded as libwebrtc's
`rtcp::TransportFeedback` (modules/rtp_rtcp/source/rtcp_packet/transport_feedback.cc) does, so
that a packet this module writes is byte for byte what Chromium would write for the same
arrivals:

    |V=2|P|  FMT=15 |    PT=205     |           length              |
    |                     SSRC of packet sender                     |
    |                      SSRC of media source                     |
    |      base sequence number     |      packet status count      |
    |                 reference time                | fb pkt. count |
    |          packet chunk         |         packet chunk          |  ...
    |         packet chunk          |  recv delta   |  recv delta   |  ...
    |           recv delta          |  recv delta   | zero padding  |

- A packet's status is one of: not received, received with a small delta (1 byte, 0..255 ×
  250 µs) or received with a large or negative delta (2 bytes, signed, × 250 µs). The fourth
  symbol is reserved (a parse error here).
- Statuses travel in 16-bit chunks: run length (one status up to 8191 times), or a status
  vector of 14 one-bit symbols (not received / small) or 7 two-bit symbols. Which one is
  chosen follows libwebrtc's `LastChunk` exactly (transport_feedback_chunks.py).
- The reference time is 24 bits in 64 ms units (signed per the draft; libwebrtc writes it
  unsigned, modulo 2^24: the same bytes below 2^23). Each received packet's delta is from the
  previous received packet's time, the first one's from the reference time.
- The packet is padded to 32 bits with the P bit set and the last byte the padding length.

Here a packet is a frozen value, `TransportFeedback`, whose `packets` give each status with
its arrival time in µs as encoded (reference time × 64000 + the cumulative deltas × 250):
absolute on the receiver's clock, modulo the 24-bit reference time's wrap (2^24 × 64 ms,
about 12.4 days). Only differences between arrivals are meaningful to a sender.

Pure: no I/O, no aiortc. aiortc itself does not know this packet: its `RtcpRtpfbPacket.parse`
reads any RTPFB FCI as NACK pairs and, for a padded one, raises (dropping the whole compound
datagram); read feedback from the plaintext datagram with `transport_feedback_packets`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from struct import pack, unpack_from
from typing import Final

from render_server.transport.rtcp_compound import rtcp_pieces
from render_server.transport.transport_feedback_chunks import (
    LARGE,
    NOT_RECEIVED,
    RESERVED,
    SMALL,
    Chunks,
    LastChunk,
    decode_chunk,
)
from render_server.transport.transport_feedback_sequence import is_newer

TRANSPORT_FEEDBACK_FMT: Final = 15
RTCP_RTPFB: Final = 205  # generic RTP feedback (RFC 4585)

DELTA_TICK_US: Final = 250  # a receive delta's unit
REFERENCE_TICK_US: Final = 64_000  # the reference time's unit (250 µs × 2^8)
REFERENCE_WRAP_US: Final = REFERENCE_TICK_US << 24  # the 24-bit reference time wraps
MAX_STATUS_COUNT: Final = 0xFFFF  # the 16-bit packet status count
# the RTCP length field counts 32-bit words less one, in 16 bits
MAX_PACKET_SIZE: Final = (1 << 16) * 4

_HEADER_SIZE: Final = 4 + 8 + 8  # common header, two SSRCs, the feedback header
_MIN_BODY_SIZE: Final = 8 + 8 + 2  # two SSRCs, the feedback header, one chunk


def _delta_ticks(arrival_us: int, last_us: int) -> int:
    """The receive delta from `last_us` to `arrival_us` in 250 µs ticks, rounded half away
    from zero, the difference taken modulo the reference time's wrap as libwebrtc's
    `AddReceivedPacket` does."""
    diff = (arrival_us - last_us) % REFERENCE_WRAP_US
    if diff > REFERENCE_WRAP_US // 2:
        return -((REFERENCE_WRAP_US - diff + DELTA_TICK_US // 2) // DELTA_TICK_US)
    return (diff + DELTA_TICK_US // 2) // DELTA_TICK_US


def _reference_ticks(arrival_us: int) -> int:
    """libwebrtc's `SetBase`: the 64 ms tick at or before `arrival_us`, modulo 2^24, here as
    the draft's signed 24-bit value."""
    ticks = (arrival_us // REFERENCE_TICK_US) & 0xFFFFFF
    return ticks - (1 << 24) if ticks >= 1 << 23 else ticks


@dataclass(frozen=True, slots=True)
class TransportFeedback:
    """One transport-wide feedback packet.

    `packets` has one entry per status, in sequence order from `base_sequence` (wrapping at
    2^16): the transport-wide sequence number and its arrival in µs as encoded (see the
    module's docstring), or None for a packet not received. Every arrival is the reference
    time (× 64 ms) plus whole 250 µs ticks that fit the format; anything else is a ValueError.
    """

    sender_ssrc: int
    media_ssrc: int
    base_sequence: int  # 16-bit
    reference_time: int  # 24-bit signed, units of 64 ms
    feedback_count: int  # 8-bit
    packets: tuple[tuple[int, int | None], ...]

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("sender_ssrc", self.sender_ssrc, 0, 0xFFFFFFFF),
            ("media_ssrc", self.media_ssrc, 0, 0xFFFFFFFF),
            ("base_sequence", self.base_sequence, 0, 0xFFFF),
            ("reference_time", self.reference_time, -(1 << 23), (1 << 23) - 1),
            ("feedback_count", self.feedback_count, 0, 0xFF),
        ):
            if not low <= value <= high:
                raise ValueError(f"transport feedback {name} {value} is out of range")
        packets = tuple((seq, arrival) for seq, arrival in self.packets)
        if not 0 < len(packets) <= MAX_STATUS_COUNT:
            raise ValueError(f"transport feedback must report 1..65535 packets, not {len(packets)}")
        object.__setattr__(self, "packets", packets)
        self._deltas()  # the arrivals must be encodable

    def _deltas(self) -> list[int]:
        """The receive deltas in ticks, one per received packet (ValueError if one does not
        fit the format or the sequence numbers are not consecutive)."""
        deltas: list[int] = []
        last_us = self.reference_time * REFERENCE_TICK_US
        for i, (seq, arrival_us) in enumerate(self.packets):
            if seq != (self.base_sequence + i) & 0xFFFF:
                raise ValueError(
                    f"transport feedback status {i} is for sequence number {seq}, "
                    f"not {(self.base_sequence + i) & 0xFFFF}"
                )
            if arrival_us is None:
                continue
            ticks, rest = divmod(arrival_us - last_us, DELTA_TICK_US)
            if rest or not -0x8000 <= ticks <= 0x7FFF:
                raise ValueError(
                    f"transport feedback arrival {arrival_us} µs of sequence number {seq} is "
                    f"not a 16-bit count of 250 µs after the previous one ({last_us} µs)"
                )
            deltas.append(ticks)
            last_us = arrival_us
        return deltas

    @classmethod
    def parse(cls, fci_and_ssrcs: bytes) -> TransportFeedback:
        """A packet from its RTCP body after the 4-byte common header (the sender SSRC, the
        media SSRC and the FCI). Bytes after the receive deltas (padding) are ignored, as
        libwebrtc does; anything malformed is a ValueError."""
        data = bytes(fci_and_ssrcs)
        if len(data) < _MIN_BODY_SIZE:
            raise ValueError(f"transport feedback of {len(data)} bytes is too short")
        sender_ssrc, media_ssrc, base_sequence, status_count = unpack_from("!IIHH", data)
        reference_time = int.from_bytes(data[12:15], "big", signed=True)
        feedback_count = data[15]
        if status_count == 0:
            raise ValueError("transport feedback reports no packet")
        symbols: list[int] = []
        index = 16
        while len(symbols) < status_count:
            if index + 2 > len(data):
                raise ValueError(
                    f"transport feedback chunks end after {len(symbols)} of {status_count} statuses"
                )
            chunk = (data[index] << 8) | data[index + 1]
            index += 2
            symbols += decode_chunk(chunk, status_count - len(symbols))
        if RESERVED in symbols:
            raise ValueError("transport feedback uses the reserved status symbol")
        if index + sum(symbols) > len(data):
            raise ValueError("transport feedback without its receive deltas")
        packets: list[tuple[int, int | None]] = []
        arrival_us = reference_time * REFERENCE_TICK_US
        for i, symbol in enumerate(symbols):
            seq = (base_sequence + i) & 0xFFFF
            if symbol == NOT_RECEIVED:
                packets.append((seq, None))
                continue
            if symbol == SMALL:
                ticks = data[index]
            else:
                ticks = int.from_bytes(data[index : index + 2], "big", signed=True)
            index += symbol
            arrival_us += ticks * DELTA_TICK_US
            packets.append((seq, arrival_us))
        # built from the wire's own fields, so valid by construction: `__post_init__`'s checks
        # (a pass over every packet, re-deriving each delta) are skipped on this path
        feedback = object.__new__(cls)
        for name, value in (
            ("sender_ssrc", sender_ssrc),
            ("media_ssrc", media_ssrc),
            ("base_sequence", base_sequence),
            ("reference_time", reference_time),
            ("feedback_count", feedback_count),
            ("packets", tuple(packets)),
        ):
            object.__setattr__(feedback, name, value)
        return feedback

    def __bytes__(self) -> bytes:
        """The whole RTCP packet, common header and padding included."""
        deltas = iter(self._deltas())
        chunks = Chunks()
        written = bytearray()
        for _, arrival_us in self.packets:
            if arrival_us is None:
                chunks.add(NOT_RECEIVED)
                continue
            ticks = next(deltas)
            if 0 <= ticks <= 0xFF:
                chunks.add(SMALL)
                written.append(ticks)
            else:
                chunks.add(LARGE)
                written += pack("!h", ticks)
        words = chunks.words()
        body = (
            pack("!IIHH", self.sender_ssrc, self.media_ssrc, self.base_sequence, len(self.packets))
            + (self.reference_time & 0xFFFFFF).to_bytes(3, "big")
            + bytes((self.feedback_count,))
            + pack(f"!{len(words)}H", *words)
            + written
        )
        padding = -(4 + len(body)) % 4
        if padding:
            body += bytes(padding - 1) + bytes((padding,))
        first = 0x80 | (0x20 if padding else 0) | TRANSPORT_FEEDBACK_FMT
        return pack("!BBH", first, RTCP_RTPFB, (4 + len(body)) // 4 - 1) + body

    def serialize(self) -> bytes:
        return bytes(self)

    @classmethod
    def build(
        cls,
        sender_ssrc: int,
        media_ssrc: int,
        feedback_count: int,
        arrivals: Sequence[tuple[int, int | None]],
    ) -> TransportFeedback:
        """A packet from (sequence number, absolute arrival in µs or None) in sequence order
        (16-bit numbers, which may wrap; a number skipped is reported not received), the
        reference time and the deltas chosen and rounded as libwebrtc does: the reference is
        the first received packet's arrival floored to 64 ms, each delta rounded to 250 µs
        from the previous *encoded* arrival, so that rounding does not accumulate. ValueError
        when the arrivals do not fit one packet (a delta beyond ±8.19 s, more than 65535
        statuses, numbers out of order)."""
        if not arrivals:
            raise ValueError("transport feedback needs at least one packet")
        first = next((a for _, a in arrivals if a is not None), 0)
        builder = FeedbackBuilder(
            sender_ssrc, media_ssrc, feedback_count, arrivals[0][0], first, MAX_PACKET_SIZE
        )
        for seq, arrival_us in arrivals:
            if arrival_us is None:
                added = builder.add_not_received(seq)
            else:
                added = builder.add_received(seq, arrival_us)
            if not added:
                raise ValueError(
                    f"transport feedback cannot add sequence number {seq} after "
                    f"{builder.status_count} statuses from {arrivals[0][0]}"
                )
        return builder.build()


class FeedbackBuilder:
    """One packet built one arrival at a time, as libwebrtc's `SetBase` and
    `AddReceivedPacket` do, refusing (False, nothing changed) what would not fit: a delta
    beyond 16 bits, a sequence number not newer than the last, more than 65535 statuses or
    more than `max_size` bytes (the whole RTCP packet, padding included)."""

    def __init__(
        self,
        sender_ssrc: int,
        media_ssrc: int,
        feedback_count: int,
        base_sequence: int,
        reference_us: int,
        max_size: int = MAX_PACKET_SIZE,
    ) -> None:
        self.sender_ssrc = sender_ssrc
        self.media_ssrc = media_ssrc
        self.feedback_count = feedback_count
        self.base_sequence = base_sequence & 0xFFFF
        self.reference_time = _reference_ticks(reference_us)
        self.max_size = max_size
        self._last_us = self.reference_time * REFERENCE_TICK_US  # the last encoded arrival
        self._chunks = Chunks()
        self._delta_bytes = 0
        self._packets: list[tuple[int, int | None]] = []

    @property
    def status_count(self) -> int:
        return self._chunks.count

    @property
    def size(self) -> int:
        """Bytes of the packet so far, common header and padding included."""
        return (_HEADER_SIZE + self._chunks.size + self._delta_bytes + 3) & ~3

    def add_received(self, seq: int, arrival_us: int) -> bool:
        """Report `seq` received at `arrival_us` (the numbers skipped since the last one
        not received)."""
        ticks = _delta_ticks(arrival_us, self._last_us)
        if not -0x8000 <= ticks <= 0x7FFF:
            return False
        symbol = SMALL if 0 <= ticks <= 0xFF else LARGE
        saved = self._save()
        if not self._skip_to(seq):
            return False
        self._chunks.add(symbol)
        self._delta_bytes += symbol
        if self.status_count > MAX_STATUS_COUNT or self.size > self.max_size:
            self._restore(saved)
            return False
        self._last_us += ticks * DELTA_TICK_US
        self._packets.append((seq & 0xFFFF, self._last_us))
        return True

    def add_not_received(self, seq: int) -> bool:
        """Report every number from the next one to `seq` included not received."""
        saved = self._save()
        if not self._skip_to(seq):
            return False
        self._chunks.add(NOT_RECEIVED)
        self._packets.append((seq & 0xFFFF, None))
        if self.status_count > MAX_STATUS_COUNT or self.size > self.max_size:
            self._restore(saved)
            return False
        return True

    def build(self) -> TransportFeedback:
        return TransportFeedback(
            self.sender_ssrc,
            self.media_ssrc,
            self.base_sequence,
            self.reference_time,
            self.feedback_count,
            tuple(self._packets),
        )

    def _skip_to(self, seq: int) -> bool:
        """Add the not-received statuses before `seq`; False if `seq` is not next or newer
        (nothing added then)."""
        seq &= 0xFFFF
        following = (self.base_sequence + self.status_count) & 0xFFFF
        if seq == following:
            return True
        if not is_newer(seq, (following - 1) & 0xFFFF):
            return False
        missing = (seq - following) & 0xFFFF
        if self.status_count + missing >= MAX_STATUS_COUNT:
            return False
        self._chunks.add_not_received(missing)
        self._packets += [((following + i) & 0xFFFF, None) for i in range(missing)]
        return True

    def _save(self) -> tuple[LastChunk, int, int, int, int]:
        chunks = self._chunks
        return (
            chunks.last.copy(),
            len(chunks.encoded),
            chunks.count,
            self._delta_bytes,
            len(self._packets),
        )

    def _restore(self, saved: tuple[LastChunk, int, int, int, int]) -> None:
        last, encoded, count, delta_bytes, packets = saved
        self._chunks.last = last
        del self._chunks.encoded[encoded:]
        self._chunks.count = count
        self._delta_bytes = delta_bytes
        del self._packets[packets:]


def transport_feedback_packets(data: bytes) -> list[TransportFeedback]:
    """Every RTPFB FMT=15 packet in a compound RTCP datagram (plaintext, after SRTCP
    unprotect); others skipped; a malformed one skipped (never raises)."""
    return split_transport_feedback(data)[0]


def split_transport_feedback(data: bytes) -> tuple[list[TransportFeedback], bytes]:
    """The transport feedback of a compound RTCP datagram, and the datagram without it.

    aiortc 1.16 reads FMT 15 as NACK pairs and, where the packet is padded (libwebrtc pads
    it whenever its length needs), refuses the whole datagram: a receiver report or NACK
    beside the feedback would be lost with it. The rest goes to aiortc instead."""
    found: list[TransportFeedback] = []
    rest: list[bytes] = []
    for piece in rtcp_pieces(bytes(data)):
        first, body = piece.first, piece.body
        if piece.packet_type != RTCP_RTPFB or first & 0x1F != TRANSPORT_FEEDBACK_FMT:
            rest.append(piece.raw)  # aiortc's, a tail that does not parse included
            continue
        if first & 0x20:  # padding: its length in the last byte
            if not body or not body[-1] or body[-1] > len(body):
                continue
            body = body[: -body[-1]]
        try:
            found.append(TransportFeedback.parse(body))
        except ValueError:
            continue
    return found, b"".join(rest)


def arrivals_of(feedbacks: Iterable[TransportFeedback]) -> dict[int, int | None]:
    """Each 16-bit sequence number reported in `feedbacks` with its arrival in µs, or None
    while every report of it says not received (a later report of it received wins)."""
    arrivals: dict[int, int | None] = {}
    for feedback in feedbacks:
        for seq, arrival_us in feedback.packets:
            if arrival_us is not None or seq not in arrivals:
                arrivals[seq] = arrival_us
    return arrivals
