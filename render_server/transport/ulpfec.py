"""ULPFEC (RFC 5109) as libwebrtc generates it and as Chromium's receiver decodes it; sans-IO.

NACK repair costs a frame that lost a packet one round trip; a ULPFEC packet lets the receiver
rebuild a lost packet as soon as it arrives. This module is a port of libwebrtc's
`UlpfecGenerator`, `ForwardErrorCorrection` (encoder and decoder), `UlpfecHeaderWriter`/
`UlpfecHeaderReader` and the packet-mask tables (`fec_private_tables_random.cc`,
`fec_private_tables_bursty.cc`, `forward_error_correction_internal.cc`), checked against
webrtc-sdk/webrtc cd6792e5 (2024-10; the ULPFEC code has not changed in substance since 2023).

Wire format (RFC 5109 section 7.3, libwebrtc's `UlpfecHeaderWriter::FinalizeFecHeader`)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |E|L|P|X|  CC   |M| PT recovery |            SN base            |  FEC header
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  (10 bytes)
    |                          TS recovery                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |        length recovery        |       protection length       |  level-0 header
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  (2 + 2 or 6 bytes)
    |     mask (16 bits)            | mask continued (32 bits, L=1) |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   XOR of the protected packets' bytes after their 12-byte fixed header ...

E = 0. P, X, CC, M, PT, TS are the XOR of the protected packets' fields; length recovery the XOR
of their lengths less 12. libwebrtc protects everything after the 12-byte fixed header, CSRCs
and header extensions included, and "protection length" is the longest of those (the whole
packet: one level, level 0 only). Mask bit i (MSB first) protects sequence number SN base + i;
L = 1 (48-bit mask) exactly when the protected sequence numbers span more than 16.

Masks: for N media and K FEC packets (K = `num_fec_packets(N, protection_factor)`, libwebrtc's
`NumFecPackets`: (N * factor + 128) >> 8, at least 1 where factor > 0) the rows are the table
entry (N, K) of the random (libwebrtc's default) or bursty table for N <= 12; from 13 media
packets on, libwebrtc generates an interleaved code at run time (media j in FEC row j mod K),
whatever the mask type. Where the media sequence numbers have gaps, the table's columns move to
the sequence numbers' positions (`InsertZerosInPacketMasks`); a batch spanning more than 48
sequence numbers gets no FEC.

The generator's batching is libwebrtc's (`UlpfecGenerator::AddPacketAndGenerateFec`): packets
are collected (at most 48; more are left unprotected) and FEC is made only when a packet with
the marker bit completes a frame, and then only once `max_fec_frames` frames are in, or earlier
where the overhead over the batch is close enough to the target (actual - target <
`MAX_EXCESS_OVERHEAD` Q8) and there are enough media packets (`MIN_MEDIA_PACKETS` when the
factor exceeds `HIGH_PROTECTION_THRESHOLD`, one more when frames average two packets or more).
With `max_fec_frames` 1 every frame gets its own FEC right after its last packet.

How the packets must go on the wire (what libwebrtc does, and what its receiver relies on):

* Media must carry its final sequence numbers before it is fed to the generator: SN base and
  mask name them as on the wire. libwebrtc feeds the generator in the pacer, after
  `AssignSequenceNumber`.
* Each FEC packet goes inside RED (block PT = ulpfec's PT; `FecPacket.to_rtp`) on the media
  SSRC, with the RTP header of the last protected media packet (CSRCs and header extensions
  kept; P and M cleared), the frame's timestamp, marker 0, and a sequence number of its own
  taken from the media's counter: the next ones after the frame (libwebrtc's pacer sends FEC
  behind the frame's last packet, same priority as video). FEC packets are never retransmitted
  (`set_allow_retransmission(false)`): a NACK for one goes unanswered.
* Every protected media packet must go out RED-wrapped as well (`red.wrap_red`): Chromium feeds
  its FEC decoder only with packets of the RED payload type; media sent with its own payload
  type is decoded but cannot take part in recovery.
* Header extensions the sender writes after FEC is computed must be zero in what the generator
  XORs: the receiver zeroes transport-cc (both versions), abs-send-time and toffset (and
  video-timing from its pacer-exit field) in each received packet before decoding
  (`RtpPacket::ZeroMutableExtensions`). Pass their negotiated ids as `zero_extension_ids`;
  otherwise those bytes come out wrong in a recovered packet.
* Retransmissions: Chromium maps an RTX payload type to RED's through `a=fmtp:<rtx> apt=<red>`
  (`red_rtx_payload_type`) as well as to the media's; a retransmitted packet (RTX unwrapped is
  marked recovered) is delivered but never given to the FEC decoder. libwebrtc retransmits the
  packet as it was sent, RED-wrapped, hence on the rtx PT whose apt is RED.

Receiver behaviour (`UlpfecReceiver`, `ForwardErrorCorrection::DecodeFec`, mirrored by
`UlpfecDecoder`): arrival order does not matter inside a window. FEC packets are kept sorted by
sequence number (the 48 newest), media and recovered packets likewise (the 192 newest); every
arriving packet triggers a pass over the stored FEC packets, each of which rebuilds a packet
when exactly one of those it protects is missing, again until nothing changes, so a rebuilt
packet helps rebuild the next. A FEC packet is dropped once nothing it protects is missing, or
once it is more than 0x3fff sequence numbers old; with 192 packets tracked, a packet more than
192 past the newest resets the decoder. (Where the stored packets span more than half the
sequence-number space, libwebrtc's sort order is undefined, and so are its results.)

The FEC packet's own sequence number is reported to the packet buffer and the NACK module as
received padding; a lost FEC packet is NACKed like a lost media packet. For VP8, VP9 and AV1
(first-packet-in-frame from the payload descriptor or the dependency descriptor) the hole does
not hold frames back. For H.264, PacketBuffer releases a delta frame only when no earlier
sequence number is missing (`missing_packets_`), so an unanswered NACK for a FEC packet stalls
H.264 until a keyframe: answer it (retransmit the RED packet) or keep ULPFEC off for H.264.
That is why libwebrtc's sender turns ULPFEC off with NACK for everything but VP8 and VP9
(`ShouldDisableRedAndUlpfec` in call/rtp_video_sender.cc); its receiver decodes ULPFEC whatever
the codec (`MaybeConstructUlpfecReceiver` only asks for a RED payload type).

Pure: no aiortc, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cmp_to_key
from typing import Final, Literal, TypeVar

from render_server.transport.red import (
    MARKER_BIT,
    PAYLOAD_TYPE_MASK,
    RED_HEADER_SIZE,
    RTP_HEADER_SIZE,
    red_block_payload_type,
    rtp_layout,
    unwrap_red,
)

MaskType = Literal["random", "bursty"]

MAX_MEDIA_PACKETS: Final = 48  # kUlpfecMaxMediaPackets: what one mask can protect
MAX_FEC_PACKETS: Final = 48  # kMaxFecPackets: FEC packets the decoder keeps
MAX_TRACKED_MEDIA_PACKETS: Final = 4 * MAX_MEDIA_PACKETS  # kMaxTrackedMediaPackets
MAX_PROTECTION_FACTOR: Final = 255  # kMaxProtectionFactor: 255 = one FEC packet per media packet
MASK_SIZE_L_CLEAR: Final = 2  # kUlpfecPacketMaskSizeLBitClear: 16 sequence numbers
MASK_SIZE_L_SET: Final = 6  # kUlpfecPacketMaskSizeLBitSet: 48 sequence numbers
FEC_LEVEL0_HEADER_SIZE: Final = 10  # kFecLevel0HeaderSize
HEADER_SIZE_L_CLEAR: Final = FEC_LEVEL0_HEADER_SIZE + 2 + MASK_SIZE_L_CLEAR  # 14
HEADER_SIZE_L_SET: Final = FEC_LEVEL0_HEADER_SIZE + 2 + MASK_SIZE_L_SET  # 18
PACKET_MASK_OFFSET: Final = FEC_LEVEL0_HEADER_SIZE + 2  # kPacketMaskOffset: 12
MAX_PACKET_OVERHEAD: Final = HEADER_SIZE_L_SET + RED_HEADER_SIZE  # beyond the largest protected
IP_PACKET_SIZE: Final = 1500  # libwebrtc's IP_PACKET_SIZE: the decoder's bound on lengths

# UlpfecGenerator's constants
MAX_EXCESS_OVERHEAD: Final = 50  # kMaxExcessOverhead, Q8
MIN_MEDIA_PACKETS: Final = 4  # kMinMediaPackets
HIGH_PROTECTION_THRESHOLD: Final = 80  # kHighProtectionThreshold
MIN_MEDIA_PACKETS_ADAPTATION_THRESHOLD: Final = 2.0  # kMinMediaPacketsAdaptationThreshold

OLD_SEQUENCE_THRESHOLD: Final = 0x3FFF  # kOldSequenceThreshold
L_BIT: Final = 0x40
_SEQ_MASK: Final = 0xFFFF

# The mask tables, copied from libwebrtc: _TABLE[N - 1][K - 1] is the mask for K FEC packets
# protecting N media packets, one 16-bit row (hex) per FEC packet, MSB = the first media packet.
# fec_private_tables_random.cc: kMaskRandomN_K; fec_private_tables_bursty.cc: kMaskBurstyN_K.
_RANDOM_TABLE: Final[tuple[tuple[str, ...], ...]] = (
    (  # 1 media packet
        "8000",
    ),
    (  # 2 media packets
        "c000",
        "c000 8000",
    ),
    (  # 3 media packets
        "e000",
        "c000 a000",
        "c000 a000 6000",
    ),
    (  # 4 media packets
        "f000",
        "c000 b000",
        "c000 b000 6000",
        "c000 a000 3000 5000",
    ),
    (  # 5 media packets
        "f800",
        "a800 d000",
        "b000 c800 5000",
        "c800 b000 5000 2800",
        "c000 3000 1800 a000 4800",
    ),
    (  # 6 media packets
        "fc00",
        "a800 d400",
        "d000 6800 a400",
        "a800 5800 6400 9400",
        "a800 8400 6400 9000 5800",
        "9800 6400 5000 1400 a800 e000",
    ),
    (  # 7 media packets
        "fe00",
        "d400 aa00",
        "d000 aa00 6400",
        "d000 aa00 6400 1c00",
        "0c00 b000 1a00 c400 6200",
        "8c00 4a00 6400 d000 a000 3200",
        "4a00 9400 1a00 c400 2800 c200 3400",
    ),
    (  # 8 media packets
        "ff00",
        "aa00 d500",
        "c500 9200 6a00",
        "4500 b400 6a00 8900",
        "8c00 9200 2b00 5100 6400",
        "a100 5200 9100 2a00 c400 4c00",
        "1500 c200 2500 6200 5800 8c00 a300",
        "2500 8a00 9100 6800 3200 4300 c400 1c00",
    ),
    (  # 9 media packets
        "ff80",
        "aa80 d500",
        "a500 c800 5280",
        "a200 c900 5280 2480",
        "8c00 2500 9280 4180 5800",
        "8480 2700 5180 1a00 6800 8900",
        "8c00 4700 8180 1280 5800 2880 b400",
        "2c00 9100 4080 0680 c800 4500 3080 a200",
        "4c00 6200 9100 4280 a400 1300 3080 8880 0900",
    ),
    (  # 10 media packets
        "ffc0",
        "aa80 d540",
        "a440 c900 5280",
        "ca00 3280 a140 5500",
        "ca00 3280 a140 5500 08c0",
        "0e00 3300 10c0 4540 8880 e000",
        "4600 3300 80c0 0c40 2880 9400 c100",
        "2c00 8180 a040 0540 1880 c200 2280 5040",
        "4c00 2300 88c0 2140 5280 9400 2600 4840 9180",
        "4c00 5100 a040 04c0 0380 8600 2900 4240 9800 3080",
    ),
    (  # 11 media packets
        "ffe0",
        "ecc0 9ba0",
        "cac0 f140 b620",
        "c4c0 3160 4b20 2ca0",
        "8680 2320 1620 4c20 41c0",
        "6440 5140 0ca0 a120 12a0 8a40",
        "4640 3320 9180 a420 50a0 84c0 0960",
        "0c80 8060 a080 0540 4300 1a00 6020 1420",
        "4640 6260 8c00 0160 0780 a080 18a0 9100 7800",
        "6440 5140 a900 04c0 d000 8240 2120 0c20 4a00 12a0",
        "4640 3320 9900 0580 80a0 8440 4060 0a80 6800 1020 3040",
    ),
    (  # 12 media packets
        "fff0",
        "ecc0 93b0",
        "9b80 4f10 3c60",
        "8b20 14b0 22d0 4550",
        "5360 6420 0cc0 82a0 0930",
        "5140 c510 2180 1230 08e0 2e00",
        "5360 2130 9090 0250 06a0 2c00 8860",
        "2060 8030 4240 0190 1410 0a80 3800 c500",
        "5360 e420 2440 a110 1830 0390 8a10 0490 00e0",
        "5140 4510 80d0 2420 0a20 00e0 b800 0910 5600 a280",
        "5360 2130 1090 0070 0c10 40c0 6a00 8600 2480 8900 c020",
        "1060 0230 4050 2180 8110 1480 9800 0890 6200 2420 8a00 8440",
    ),
)

_BURSTY_TABLE: Final[tuple[tuple[str, ...], ...]] = (
    (  # 1 media packet
        "8000",
    ),
    (  # 2 media packets
        "c000",
        "8000 c000",
    ),
    (  # 3 media packets
        "e000",
        "c000 a000",
        "8000 c000 6000",
    ),
    (  # 4 media packets
        "f000",
        "a000 d000",
        "c000 6000 9000",
        "8000 c000 6000 3000",
    ),
    (  # 5 media packets
        "f800",
        "d000 a800",
        "7000 9000 c800",
        "c000 6000 3000 8800",
        "8000 c000 6000 3000 1800",
    ),
    (  # 6 media packets
        "fc00",
        "a800 d400",
        "9400 c800 6400",
        "6000 3800 8800 c400",
        "c000 6000 3000 1800 8400",
        "8000 c000 6000 3000 1800 0c00",
    ),
    (  # 7 media packets
        "fe00",
        "d400 aa00",
        "c800 7400 9200",
        "3800 8a00 c400 6200",
        "6000 3000 1c00 8400 c200",
        "c000 6000 3000 1800 0c00 8200",
        "8000 c000 6000 3000 1800 0c00 0600",
    ),
    (  # 8 media packets
        "ff00",
        "aa00 d500",
        "7400 9200 c900",
        "8a00 c500 6200 3100",
        "3000 1c00 8500 c200 6100",
        "6000 3000 1800 0e00 8200 c100",
        "c000 6000 3000 1800 0c00 0600 8100",
        "8000 c000 6000 3000 1800 0c00 0600 0300",
    ),
    (  # 9 media packets
        "ff80",
        "d500 aa80",
        "9200 c900 7480",
        "c500 6200 3900 8a80",
        "1c00 8500 c280 6100 3080",
        "3000 1800 0e00 8280 c100 6080",
        "6000 3000 1800 0c00 0700 8100 c080",
        "c000 6000 3000 1800 0c00 0600 0300 8080",
        "8000 c000 6000 3000 1800 0c00 0600 0300 0180",
    ),
    (  # 10 media packets
        "ffc0",
        "aa80 d540",
        "c900 7480 9240",
        "6200 3900 8a80 c540",
        "8500 c280 6140 3080 1840",
        "1800 0e00 8280 c140 6080 3040",
        "3000 1800 0c00 0700 8140 c080 6040",
        "6000 3000 1800 0c00 0600 0300 8080 c040",
        "c000 6000 3000 1800 0c00 0600 0300 0180 8040",
        "8000 c000 6000 3000 1800 0c00 0600 0300 0180 00c0",
    ),
    (  # 11 media packets
        "ffe0",
        "d540 aaa0",
        "7480 9240 c920",
        "3900 8a80 c540 6220",
        "c2c0 6100 30a0 1c40 8520",
        "0e00 8280 c140 60a0 3040 1820",
        "1800 0c00 0700 8140 c0a0 6040 3020",
        "3000 1800 0c00 0600 0340 80a0 c040 6020",
        "6000 3000 1800 0c00 0600 0300 0180 8040 c020",
        "c000 6000 3000 1800 0c00 0600 0300 0180 00c0 8020",
        "8000 c000 6000 3000 1800 0c00 0600 0300 0180 00c0 0060",
    ),
    (  # 12 media packets
        "fff0",
        "aaa0 d550",
        "9240 c920 7490",
        "8a80 c540 6220 3910",
        "6100 30a0 1c50 8520 c290",
        "8290 c140 60a0 3050 1820 0c10",
        "0c00 0700 8140 c0a0 6050 3020 1810",
        "1800 0c00 0600 0300 80a0 c050 6020 3010",
        "3000 1800 0c00 0600 0300 0180 8050 c020 6010",
        "6000 3000 1800 0c00 0600 0300 0180 00c0 8020 c010",
        "c000 6000 3000 1800 0c00 0600 0300 0180 00c0 0060 8010",
        "8000 c000 6000 3000 1800 0c00 0600 0300 0180 00c0 0060 0030",
    ),
)

_TABLED_MEDIA_PACKETS: Final = len(_RANDOM_TABLE)  # 12: beyond, the interleaved code


# -- packet masks and counts ------------------------------------------------------------------


def num_fec_packets(num_media_packets: int, protection_factor: int) -> int:
    """libwebrtc's `ForwardErrorCorrection::NumFecPackets`: `protection_factor`/256 of the
    media packets, rounded half up, at least one where the factor is not 0."""
    if not 0 <= protection_factor <= MAX_PROTECTION_FACTOR:
        raise ValueError(f"protection factor {protection_factor}: not in 0..255")
    if num_media_packets < 0:
        raise ValueError(f"{num_media_packets} media packets")
    count = (num_media_packets * protection_factor + (1 << 7)) >> 8
    if protection_factor > 0 and count == 0:
        count = 1
    return count


def packet_mask_size(num_sequence_numbers: int) -> int:
    """The mask's size in bytes for a span of that many sequence numbers (`PacketMaskSize`)."""
    if not 0 <= num_sequence_numbers <= 8 * MASK_SIZE_L_SET:
        raise ValueError(f"a mask over {num_sequence_numbers} sequence numbers")
    return MASK_SIZE_L_SET if num_sequence_numbers > 8 * MASK_SIZE_L_CLEAR else MASK_SIZE_L_CLEAR


def packet_masks(
    num_media_packets: int, num_fec: int, mask_type: MaskType = "random"
) -> tuple[bytes, ...]:
    """The packet masks libwebrtc uses for `num_fec` FEC packets over `num_media_packets`
    consecutive media packets (`PacketMaskTable::LookUp`): one row per FEC packet, of
    `packet_mask_size(num_media_packets)` bytes, bit 7 of byte 0 = the first media packet."""
    if not 1 <= num_media_packets <= MAX_MEDIA_PACKETS:
        raise ValueError(f"{num_media_packets} media packets: not in 1..48")
    if not 1 <= num_fec <= num_media_packets:
        raise ValueError(f"{num_fec} FEC packets for {num_media_packets} media packets")
    if mask_type not in ("random", "bursty"):
        raise ValueError(f"mask type {mask_type!r}: not random or bursty")
    if num_media_packets <= _TABLED_MEDIA_PACKETS:
        table = _BURSTY_TABLE if mask_type == "bursty" else _RANDOM_TABLE
        return tuple(
            bytes.fromhex(row) for row in table[num_media_packets - 1][num_fec - 1].split()
        )
    size = packet_mask_size(num_media_packets)
    rows = []
    for row in range(num_fec):
        bits = 0
        for media in range(row, num_media_packets, num_fec):
            bits |= 1 << (8 * size - 1 - media)
        rows.append(bits.to_bytes(size, "big"))
    return tuple(rows)


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
            (self.seq_num_base + i) & _SEQ_MASK for i in range(width) if bits >> (width - 1 - i) & 1
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


def _protected_value(packet: bytes) -> int:
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


def _is_newer(sequence: int, previous: int) -> bool:
    """libwebrtc's `IsNewerSequenceNumber`."""
    diff = (sequence - previous) & _SEQ_MASK
    if diff == 0x8000:
        return sequence > previous
    return diff != 0 and diff < 0x8000


def _min_diff(a: int, b: int) -> int:
    return min((a - b) & _SEQ_MASK, (b - a) & _SEQ_MASK)


# -- the generator ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FecParams:
    """libwebrtc's `FecProtectionParams`. `protection_factor` (`fec_rate`) is FEC packets per
    media packet in 1/256 (255: as many FEC as media packets; libwebrtc's `kMaxProtectionFactor`
    scale); `max_fec_frames`: the most frames one batch of FEC protects (0 and 1 alike: every
    frame its own)."""

    protection_factor: int = 0
    mask_type: MaskType = "random"
    max_fec_frames: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.protection_factor <= MAX_PROTECTION_FACTOR:
            raise ValueError(f"protection factor {self.protection_factor}: not in 0..255")
        if self.mask_type not in ("random", "bursty"):
            raise ValueError(f"mask type {self.mask_type!r}: not random or bursty")
        if self.max_fec_frames < 0:
            raise ValueError(f"max_fec_frames {self.max_fec_frames}")


@dataclass(frozen=True, slots=True)
class FecPacket:
    """One generated ULPFEC packet and what its RTP header must say.

    `payload` is the ULPFEC payload (FEC header, level-0 header, XOR'd data). On the wire it
    goes inside RED (block PT = ulpfec's) on the media SSRC `ssrc`, timestamp `timestamp` (that
    of the last protected media packet), marker 0, and a sequence number of the media's counter
    not used by media, normally the next one after the frame: the caller assigns it, as it must
    have assigned the media's before they were fed to the generator (`seq_num_base` and the mask
    name the protected packets' numbers as they go on the wire: `protected`). `header` is the
    RTP header of the last protected media packet (CSRCs and header extensions included), the
    template libwebrtc copies; `to_rtp` builds the packet from it."""

    payload: bytes
    ssrc: int
    timestamp: int
    seq_num_base: int
    protected: tuple[int, ...]
    header: bytes

    @property
    def marker(self) -> bool:
        """Always False: FEC packets never end a frame."""
        return False

    def red_payload(self, ulpfec_pt: int) -> bytes:
        """The RTP payload of the RED packet that carries this FEC packet."""
        if not 0 <= ulpfec_pt <= PAYLOAD_TYPE_MASK:
            raise ValueError(f"ULPFEC payload type {ulpfec_pt}: not in 0..127")
        return bytes((ulpfec_pt,)) + self.payload

    def to_rtp(
        self, sequence_number: int, red_pt: int, ulpfec_pt: int, *, keep_extensions: bool = True
    ) -> bytes:
        """The serialized RTP packet, as libwebrtc's `GetFecPackets` makes it: the last media
        packet's header with payload type `red_pt`, marker and padding bit cleared, sequence
        number `sequence_number`, then the RED header (block PT `ulpfec_pt`) and the payload.
        Its header extensions are kept (per-packet ones, such as the transport-wide sequence
        number, are the sender's to rewrite) unless `keep_extensions` is False."""
        if not 0 <= red_pt <= PAYLOAD_TYPE_MASK:
            raise ValueError(f"RED payload type {red_pt}: not in 0..127")
        header = self.header
        first = header[0] & ~0x20  # no padding
        if not keep_extensions:
            first &= ~0x10
            header = header[: RTP_HEADER_SIZE + 4 * (header[0] & 0x0F)]
        return b"".join(
            (
                bytes((first & 0xFF, red_pt)),
                (sequence_number & _SEQ_MASK).to_bytes(2, "big"),
                header[4:],
                self.red_payload(ulpfec_pt),
            )
        )


@dataclass(slots=True)
class _Media:
    seq: int
    value: int  # _protected_value of the packet, mutable extensions zeroed
    length: int  # bytes after the fixed header
    timestamp: int
    header: bytes


class UlpfecGenerator:
    """libwebrtc's `UlpfecGenerator`, sans-IO. Feed it each media packet of the stream, in
    sending order and already numbered (`add_media_packet`); after a packet with the marker bit
    take what it made (`fec_packets`, or just the payloads with `fec_payloads`).

    `params` apply to batches without a keyframe, `key_params` (default: `params`) to batches
    with one. `set_params` takes effect at the next packet, as in libwebrtc. `max_fec_packets`,
    where given, caps the FEC packets of one batch (not in libwebrtc: the masks are then the
    table's for the capped count, which the receiver decodes all the same).
    `zero_extension_ids`: the header-extension ids the receiver zeroes before decoding
    (transport-cc, abs-send-time, toffset where negotiated); their data is XOR'd as zeros.

    A packet that breaks the sequence (another SSRC, a sequence number not newer than the
    previous one's) starts a new batch, the old one unprotected; so does a batch whose sequence
    numbers span more than 48 (libwebrtc gives it no FEC). ValueError for bytes that are not an
    RTP packet; the generator is unchanged then."""

    def __init__(
        self,
        params: FecParams | None = None,
        key_params: FecParams | None = None,
        *,
        max_fec_packets: int | None = None,
        zero_extension_ids: Iterable[int] = (),
    ) -> None:
        if max_fec_packets is not None and max_fec_packets < 1:
            raise ValueError(f"max_fec_packets {max_fec_packets}: at least 1")
        self._max_fec_packets = max_fec_packets
        self._zero_ids = frozenset(zero_extension_ids)
        self._delta = FecParams()  # libwebrtc's start: no protection until params apply
        self._key = FecParams()
        self._pending: tuple[FecParams, FecParams] | None = None
        self._min_media_packets = 1
        self._media: list[_Media] = []
        self._ssrc = 0
        self._frames = 0
        self._keyframe = False
        self._generated: list[FecPacket] = []
        self.set_params(params if params is not None else FecParams(), key_params)

    def set_params(self, params: FecParams, key_params: FecParams | None = None) -> None:
        """New protection for delta and key frames, from the next packet added on."""
        self._pending = (params, key_params if key_params is not None else params)

    @property
    def params(self) -> FecParams:
        """The parameters that apply to the batch under way (`CurrentParams`)."""
        return self._key if self._keyframe else self._delta

    @property
    def pending_media_packets(self) -> int:
        """Media packets collected for the next FEC batch."""
        return len(self._media)

    def add_media_packet(self, packet: bytes, *, keyframe: bool = False) -> None:
        """One media packet as it goes on the wire (before RED wrapping: its own payload type;
        numbered), `keyframe` where it belongs to a keyframe. Where it ends a frame (marker
        bit) and the batch is due, the FEC packets are made: take them with `fec_packets`."""
        layout = rtp_layout(packet)  # ValueError before anything changes
        seq = int.from_bytes(packet[2:4], "big")
        ssrc = int.from_bytes(packet[8:12], "big")

        if self._pending is not None:
            self._delta, self._key = self._pending
            self._pending = None
            high = self.params.protection_factor > HIGH_PROTECTION_THRESHOLD
            self._min_media_packets = MIN_MEDIA_PACKETS if high else 1
        if self._media and (ssrc != self._ssrc or not _is_newer(seq, self._media[-1].seq)):
            self._reset()
        if keyframe:
            self._keyframe = True
        complete_frame = bool(packet[1] & MARKER_BIT)
        if len(self._media) < MAX_MEDIA_PACKETS:
            self._ssrc = ssrc
            self._media.append(
                _Media(
                    seq=seq,
                    value=_protected_value(zero_extensions(packet, self._zero_ids)),
                    length=len(packet) - RTP_HEADER_SIZE,
                    timestamp=int.from_bytes(packet[4:8], "big"),
                    header=bytes(packet[: layout.header_size]),
                )
            )
        if complete_frame:
            self._frames += 1
            params = self.params
            if self._frames >= params.max_fec_frames or (
                self._excess_overhead_below_max() and self._minimum_media_packets_reached()
            ):
                self._generated.extend(self._encode(params))
                self._reset()

    def fec_packets(self) -> list[FecPacket]:
        """The FEC packets made since the last call, oldest batch first; they are handed over
        once."""
        generated, self._generated = self._generated, []
        return generated

    def fec_payloads(self) -> list[bytes]:
        """`fec_packets`, just their ULPFEC payloads."""
        return [fec.payload for fec in self.fec_packets()]

    def _reset(self) -> None:
        self._media = []
        self._frames = 0
        self._keyframe = False

    def _excess_overhead_below_max(self) -> bool:
        factor = self.params.protection_factor
        overhead = (num_fec_packets(len(self._media), factor) << 8) // len(self._media)
        return overhead - factor < MAX_EXCESS_OVERHEAD

    def _minimum_media_packets_reached(self) -> bool:
        count = len(self._media)
        if count / self._frames < MIN_MEDIA_PACKETS_ADAPTATION_THRESHOLD:
            return count >= self._min_media_packets
        return count >= self._min_media_packets + 1

    def _encode(self, params: FecParams) -> list[FecPacket]:
        media = self._media
        count = num_fec_packets(len(media), params.protection_factor)
        if self._max_fec_packets is not None:
            count = min(count, self._max_fec_packets)
        if count == 0:
            return []
        base = media[0].seq
        columns = [(m.seq - base) & _SEQ_MASK for m in media]
        span = columns[-1] + 1
        if span > MAX_MEDIA_PACKETS:
            return []  # "cannot protect media packets with a single block of FEC packets"
        mask_size = packet_mask_size(span)
        width = 8 * mask_size
        last = media[-1]
        out = []
        for row in packet_masks(len(media), count, params.mask_type):
            row_bits = int.from_bytes(row, "big")
            row_width = 8 * len(row)
            protected = [i for i in range(len(media)) if row_bits >> (row_width - 1 - i) & 1]
            mask = 0
            acc = 0
            protection_length = 0
            for i in protected:
                mask |= 1 << (width - 1 - columns[i])
                acc ^= media[i].value
                protection_length = max(protection_length, media[i].length)
            xored = acc.to_bytes(RTP_HEADER_SIZE + protection_length, "little")
            first = xored[0] & 0x3F | (L_BIT if mask_size == MASK_SIZE_L_SET else 0)
            payload = b"".join(
                (
                    bytes((first, xored[1])),
                    base.to_bytes(2, "big"),
                    xored[4:8],  # timestamp recovery
                    xored[2:4],  # length recovery
                    protection_length.to_bytes(2, "big"),
                    mask.to_bytes(mask_size, "big"),
                    xored[RTP_HEADER_SIZE:],
                )
            )
            out.append(
                FecPacket(
                    payload=payload,
                    ssrc=self._ssrc,
                    timestamp=last.timestamp,
                    seq_num_base=base,
                    protected=tuple(media[i].seq for i in protected),
                    header=last.header,
                )
            )
        return out


# -- the decoder --------------------------------------------------------------------------------


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
    return -1 if _is_newer(b, a) else (1 if _is_newer(a, b) else 0)


_SEQ_ORDER = cmp_to_key(_compare)


_Item = TypeVar("_Item", _Stored, _StoredFec)


def _insert(items: list[_Item], item: _Item) -> None:
    """`item` into `items`, kept sorted by sequence number (libwebrtc: push_back, then sort by
    `IsNewerSequenceNumber`); in order arrival costs no sort."""
    newest = not items or _is_newer(item.seq, items[-1].seq)
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
                value=_protected_value(stored),
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
            value=_protected_value(packet),
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
