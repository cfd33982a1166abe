"""libwebrtc's ULPFEC packet masks: which media packets each FEC packet protects, and how many
FEC packets a batch of media packets gets.

The mask tables (`fec_private_tables_random.cc`, `fec_private_tables_bursty.cc`), the
interleaved code libwebrtc generates from 13 media packets on
(`forward_error_correction_internal.cc`), `NumFecPackets` and `PacketMaskSize`, with the
constants they need; ulpfec.py tells how they are used. Pure.
"""

from __future__ import annotations

from typing import Final, Literal

MaskType = Literal["random", "bursty"]

MAX_MEDIA_PACKETS: Final = 48  # kUlpfecMaxMediaPackets: what one mask can protect
MAX_PROTECTION_FACTOR: Final = 255  # kMaxProtectionFactor: 255 = one FEC packet per media packet
MASK_SIZE_L_CLEAR: Final = 2  # kUlpfecPacketMaskSizeLBitClear: 16 sequence numbers
MASK_SIZE_L_SET: Final = 6  # kUlpfecPacketMaskSizeLBitSet: 48 sequence numbers

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
