"""The ULPFEC payload's headers as libwebrtc's `UlpfecHeaderReader` reads them (`FecHeader`,
`parse_fec_header`; the wire format is drawn in ulpfec.py), and what a FEC packet's XOR covers
of a media packet: `protected_value`, with the header extensions the receiver zeroes first
(`zero_extensions`). Pure.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from render_server.transport.red import RED_HEADER_SIZE, RTP_HEADER_SIZE, rtp_layout
from render_server.transport.ulpfec_masks import MASK_SIZE_L_CLEAR, MASK_SIZE_L_SET

FEC_LEVEL0_HEADER_SIZE: Final = 10  # kFecLevel0HeaderSize
HEADER_SIZE_L_CLEAR: Final = FEC_LEVEL0_HEADER_SIZE + 2 + MASK_SIZE_L_CLEAR  # 14
HEADER_SIZE_L_SET: Final = FEC_LEVEL0_HEADER_SIZE + 2 + MASK_SIZE_L_SET  # 18
PACKET_MASK_OFFSET: Final = FEC_LEVEL0_HEADER_SIZE + 2  # kPacketMaskOffset: 12
MAX_PACKET_OVERHEAD: Final = HEADER_SIZE_L_SET + RED_HEADER_SIZE  # beyond the largest protected
L_BIT: Final = 0x40
SEQ_MASK: Final = 0xFFFF


# -- header extensions --------------------------------------------------------------------------


def zero_extensions(packet: bytes, extension_ids: Collection[int]) -> bytes:
    """`packet` with the data of its header-extension elements of those ids set to zero, as
    libwebrtc's receiver does with transport-cc, abs-send-time and toffset before FEC decoding
    (`RtpPacket::ZeroMutableExtensions`). Both the one-byte (0xBEDE) and two-byte (0x100x) forms;
    the block is walked with `RtpPacket::ParseBuffer`'s rules (padding bytes skipped, a reserved
    id 15 or an oversized element ends it). ValueError where `packet` is not an RTP packet."""
    rtp_layout(packet)
    if not extension_ids or not packet[0] & 0x10:
        return packet
    start = RTP_HEADER_SIZE + 4 * (packet[0] & 0x0F)
    profile = int.from_bytes(packet[start : start + 2], "big")
    capacity = 4 * int.from_bytes(packet[start + 2 : start + 4], "big")
    if profile == 0xBEDE:
        element_header = 1
    elif profile & 0xFFF0 == 0x1000:
        element_header = 2
    else:
        return packet  # another profile: libwebrtc reads no elements from it
    offset = start + 4
    out: bytearray | None = None
    used = 0
    while used + element_header < capacity:
        first = packet[offset + used]
        if first == 0:  # padding
            used += 1
            continue
        if element_header == 1:
            element_id, length = first >> 4, 1 + (first & 0x0F)
            if element_id in (0, 15):
                break
        else:
            element_id, length = first, packet[offset + used + 1]
        if used + element_header + length > capacity:
            break
        if element_id in extension_ids:
            if out is None:
                out = bytearray(packet)
            data = offset + used + element_header
            out[data : data + length] = bytes(length)
        used += element_header + length
    return packet if out is None else bytes(out)


# -- the FEC header -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FecHeader:
    """A ULPFEC payload's headers as `parse_fec_header` reads them."""

    long_mask: bool  # L: a 48-bit mask
    recovery_bits: int  # P, X, CC recovery: the low six bits of byte 0
    marker_pt_recovery: int  # M and PT recovery: byte 1
    seq_num_base: int
    timestamp_recovery: int
    length_recovery: int
    protection_length: int
    mask: bytes

    @property
    def header_size(self) -> int:
        """FEC header and level-0 header: 14 bytes, or 18 with a long mask."""
        return HEADER_SIZE_L_SET if self.long_mask else HEADER_SIZE_L_CLEAR

    @property
    def protected(self) -> tuple[int, ...]:
        """The sequence numbers the mask names, oldest first (wrapping at 65536)."""
        bits = int.from_bytes(self.mask, "big")
        width = 8 * len(self.mask)
        return tuple(
            (self.seq_num_base + i) & SEQ_MASK for i in range(width) if bits >> (width - 1 - i) & 1
        )


def parse_fec_header(payload: bytes) -> FecHeader:
    """The headers of the ULPFEC payload `payload` (RTP payload with the RED header off), as
    libwebrtc's `UlpfecHeaderReader::ReadFecHeader` reads them. ValueError where it, or the
    decoder right after it, finds the packet cut short: under 12 bytes, or the mask cut off.
    (What else the decoder refuses, `UlpfecDecoder.add_fec_packet` checks.)"""
    size = len(payload)
    if size < PACKET_MASK_OFFSET:
        raise ValueError(f"a ULPFEC payload of {size} bytes: truncated")
    long_mask = bool(payload[0] & L_BIT)
    mask_size = MASK_SIZE_L_SET if long_mask else MASK_SIZE_L_CLEAR
    if size < PACKET_MASK_OFFSET + mask_size:
        raise ValueError(f"a ULPFEC payload of {size} bytes: its packet mask is cut off")
    protection_length = int.from_bytes(payload[10:12], "big")
    mask = bytes(payload[PACKET_MASK_OFFSET : PACKET_MASK_OFFSET + mask_size])
    return FecHeader(
        long_mask=long_mask,
        recovery_bits=payload[0] & 0x3F,
        marker_pt_recovery=payload[1],
        seq_num_base=int.from_bytes(payload[2:4], "big"),
        timestamp_recovery=int.from_bytes(payload[4:8], "big"),
        length_recovery=int.from_bytes(payload[8:10], "big"),
        protection_length=protection_length,
        mask=mask,
    )


def protected_value(packet: bytes) -> int:
    """What XOR works on, as one integer (little-endian, so that shorter packets are padded
    with zeros at the end): the first two header bytes, the length less 12 where the sequence
    number is, the timestamp, four zero bytes for the SSRC, then every byte after the fixed
    header (`XorHeaders`, `XorPayloads`)."""
    return int.from_bytes(
        b"".join(
            (
                packet[:2],
                (len(packet) - RTP_HEADER_SIZE).to_bytes(2, "big"),
                packet[4:8],
                bytes(4),
                packet[RTP_HEADER_SIZE:],
            )
        ),
        "little",
    )
