"""libwebrtc's ULPFEC decoding (`UlpfecReceiver`, `ForwardErrorCorrection::DecodeFec`):
`UlpfecDecoder`, and `recover`, a one-shot decoder. How the receiver behaves, and hence this
decoder, is told in ulpfec.py. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Final, TypeVar

from render_server.transport.red import (
    RTP_HEADER_SIZE,
    red_block_payload_type,
    rtp_layout,
    unwrap_red,
)
from render_server.transport.transport_feedback_sequence import is_newer
from render_server.transport.ulpfec_header import (
    SEQ_MASK,
    parse_fec_header,
    protected_value,
    zero_extensions,
)
from render_server.transport.ulpfec_masks import MAX_MEDIA_PACKETS

MAX_FEC_PACKETS: Final = 48  # kMaxFecPackets: FEC packets the decoder keeps
MAX_TRACKED_MEDIA_PACKETS: Final = 4 * MAX_MEDIA_PACKETS  # kMaxTrackedMediaPackets
IP_PACKET_SIZE: Final = 1500  # libwebrtc's IP_PACKET_SIZE: the decoder's bound on lengths
OLD_SEQUENCE_THRESHOLD: Final = 0x3FFF  # kOldSequenceThreshold


def _min_diff(a: int, b: int) -> int:
    return min((a - b) & SEQ_MASK, (b - a) & SEQ_MASK)


@dataclass(slots=True)
class _Stored:
    """A received (or recovered) media packet in the decoder's list (`RecoveredPacket`)."""

    seq: int
    packet: bytes
    value: int
    length: int
    returned: bool


@dataclass(slots=True)
class _StoredFec:
    """A FEC packet waiting in the decoder (`ReceivedFecPacket`)."""

    seq: int
    value: int  # the recovery start: FEC header fields where XOR puts them, then its data
    protection_length: int
    protected: list[int]
    have: dict[int, _Stored]  # protected packets at hand, by sequence number


def _compare(a: int, b: int) -> int:
    return -1 if is_newer(b, a) else (1 if is_newer(a, b) else 0)


_SEQ_ORDER = cmp_to_key(_compare)


_Item = TypeVar("_Item", _Stored, _StoredFec)


def _insert(items: list[_Item], item: _Item) -> None:
    """`item` into `items`, kept sorted by sequence number (libwebrtc: push_back, then sort by
    `IsNewerSequenceNumber`); in order arrival costs no sort."""
    newest = not items or is_newer(item.seq, items[-1].seq)
    items.append(item)
    if not newest:
        items.sort(key=lambda stored: _SEQ_ORDER(stored.seq))


class UlpfecDecoder:
    """libwebrtc's ULPFEC decoding (`UlpfecReceiver` + `ForwardErrorCorrection::DecodeFec`),
    sans-IO: give it what arrives on the media SSRC, in arrival order; each call returns the
    media packets it could rebuild thereby, oldest first, each once, bit-exact (as the receiver
    sees the original: with the `zero_extension_ids` extensions zeroed).

    `ssrc` is the media SSRC (default: that of the first packet). Packets of another SSRC, and
    packets libwebrtc would drop as malformed, raise ValueError and leave the decoder as it
    was. Retransmissions (RTX) must not be given: libwebrtc keeps them out of FEC decoding."""

    def __init__(self, ssrc: int | None = None, *, zero_extension_ids: Iterable[int] = ()) -> None:
        self._ssrc = ssrc
        self._zero_ids = frozenset(zero_extension_ids)
        self._recovered: list[_Stored] = []
        self._fec: list[_StoredFec] = []

    def add_red_packet(self, packet: bytes, ulpfec_pt: int) -> list[bytes]:
        """A packet of the RED payload type as it arrived: ULPFEC where its block PT is
        `ulpfec_pt`, media otherwise."""
        if red_block_payload_type(packet) == ulpfec_pt:
            return self.add_fec_packet(unwrap_red(packet))
        return self.add_media_packet(unwrap_red(packet))

    def add_media_packet(self, packet: bytes) -> list[bytes]:
        """A received media packet (RED header off: its own payload type)."""
        stored = zero_extensions(packet, self._zero_ids)  # ValueError if not RTP
        self._check_ssrc(packet)
        seq = int.from_bytes(packet[2:4], "big")
        self._before_insert(seq)
        if not any(item.seq == seq for item in self._recovered):
            entry = _Stored(
                seq=seq,
                packet=stored,
                value=protected_value(stored),
                length=len(stored) - RTP_HEADER_SIZE,
                returned=True,
            )
            _insert(self._recovered, entry)
            self._update_covering(entry)
        return self._after_insert()

    def add_fec_packet(self, packet: bytes) -> list[bytes]:
        """A received FEC packet: the RTP packet with the RED header off (payload type
        ulpfec's, the payload the ULPFEC payload)."""
        layout = rtp_layout(packet)
        payload = packet[layout.header_size : layout.header_size + layout.payload_size]
        header = parse_fec_header(payload)
        if not any(header.mask):
            raise ValueError("a ULPFEC packet with an all-zero mask protects nothing")
        end = header.header_size + header.protection_length
        if len(payload) < end:
            raise ValueError(
                f"a ULPFEC payload of {len(payload)} bytes protecting "
                f"{header.protection_length}: truncated"
            )
        if header.protection_length > min(
            IP_PACKET_SIZE - RTP_HEADER_SIZE, IP_PACKET_SIZE - header.header_size
        ):
            raise ValueError(
                f"protection length {header.protection_length}: longer than an IP packet"
            )
        self._check_ssrc(packet)
        seq = int.from_bytes(packet[2:4], "big")
        self._before_insert(seq)
        if not any(fec.seq == seq for fec in self._fec):
            value = int.from_bytes(
                b"".join(
                    (
                        payload[:2],
                        payload[8:10],
                        payload[4:8],
                        bytes(4),
                        payload[header.header_size : end],
                    )
                ),
                "little",
            )
            protected = list(header.protected)
            present = {item.seq: item for item in self._recovered}
            fec = _StoredFec(
                seq=seq,
                value=value,
                protection_length=header.protection_length,
                protected=protected,
                have={s: present[s] for s in protected if s in present},
            )
            _insert(self._fec, fec)
            if len(self._fec) > MAX_FEC_PACKETS:
                del self._fec[0]
        return self._after_insert()

    def _check_ssrc(self, packet: bytes) -> None:
        ssrc = int.from_bytes(packet[8:12], "big")
        if self._ssrc is None:
            self._ssrc = ssrc
        elif ssrc != self._ssrc:
            raise ValueError(f"SSRC {ssrc}, not the protected stream's {self._ssrc}")

    def _before_insert(self, seq: int) -> None:
        if len(self._recovered) == MAX_TRACKED_MEDIA_PACKETS:
            if _min_diff(seq, self._recovered[-1].seq) > MAX_TRACKED_MEDIA_PACKETS:
                self._recovered = []  # a big gap: the old packets are of no more use
                self._fec = []
        while self._fec and _min_diff(seq, self._fec[0].seq) > OLD_SEQUENCE_THRESHOLD:
            del self._fec[0]

    def _after_insert(self) -> list[bytes]:
        self._discard_old_recovered()
        self._attempt_recovery()
        out = []
        for item in self._recovered:
            if not item.returned:
                item.returned = True
                out.append(item.packet)
        return out

    def _discard_old_recovered(self) -> None:
        excess = len(self._recovered) - MAX_TRACKED_MEDIA_PACKETS
        if excess > 0:
            del self._recovered[:excess]

    def _update_covering(self, entry: _Stored) -> None:
        for fec in self._fec:
            if entry.seq in fec.protected:
                fec.have[entry.seq] = entry

    def _attempt_recovery(self) -> None:
        i = 0
        while i < len(self._fec):
            fec = self._fec[i]
            missing = len(fec.protected) - len(fec.have)
            if missing == 1:
                entry = self._recover(fec)
                del self._fec[i]
                if entry is not None:
                    _insert(self._recovered, entry)
                    self._update_covering(entry)
                    self._discard_old_recovered()
                    i = 0  # a recovered packet may complete another FEC packet
            elif missing == 0 or self._is_old(fec):
                del self._fec[i]
            else:
                i += 1

    def _is_old(self, fec: _StoredFec) -> bool:
        if not self._recovered:
            return False
        return _min_diff(self._recovered[-1].seq, fec.protected[-1]) > OLD_SEQUENCE_THRESHOLD

    def _recover(self, fec: _StoredFec) -> _Stored | None:
        """`RecoverPacket`: the FEC packet's start XOR'd with every protected packet at hand."""
        acc = fec.value
        size = RTP_HEADER_SIZE + fec.protection_length
        seq = next(s for s in fec.protected if s not in fec.have)
        for item in fec.have.values():
            acc ^= item.value
            size = max(size, RTP_HEADER_SIZE + item.length)
        xored = acc.to_bytes(size, "little")
        new_size = int.from_bytes(xored[2:4], "big") + RTP_HEADER_SIZE
        if new_size > IP_PACKET_SIZE - RTP_HEADER_SIZE:
            return None  # "a length larger than a typical IP packet"
        body = xored[RTP_HEADER_SIZE:new_size].ljust(new_size - RTP_HEADER_SIZE, b"\0")
        assert self._ssrc is not None
        packet = b"".join(
            (
                bytes((xored[0] & 0x3F | 0x80, xored[1])),  # version 2
                seq.to_bytes(2, "big"),
                xored[4:8],
                self._ssrc.to_bytes(4, "big"),
                body,
            )
        )
        return _Stored(
            seq=seq,
            packet=packet,
            value=protected_value(packet),
            length=len(packet) - RTP_HEADER_SIZE,
            returned=False,
        )


def recover(
    media_packets: Iterable[bytes],
    fec_packets: Iterable[bytes],
    *,
    ssrc: int | None = None,
    zero_extension_ids: Iterable[int] = (),
) -> dict[int, bytes]:
    """The media packets that `fec_packets` (RTP packets, RED header off) rebuild from
    `media_packets` (as received, RED header off), by sequence number: a one-shot
    `UlpfecDecoder`, media first. ValueError as for the decoder."""
    decoder = UlpfecDecoder(ssrc, zero_extension_ids=zero_extension_ids)
    out: dict[int, bytes] = {}
    for packet in media_packets:
        for rebuilt in decoder.add_media_packet(packet):
            out[int.from_bytes(rebuilt[2:4], "big")] = rebuilt
    for packet in fec_packets:
        for rebuilt in decoder.add_fec_packet(packet):
            out[int.from_bytes(rebuilt[2:4], "big")] = rebuilt
    return out
