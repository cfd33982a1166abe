"""ULPFEC (RFC 5109) as libwebrtc makes and decodes it: the masks are libwebrtc's table entries,
a FEC packet's bytes are as computed by hand, the generator batches as `UlpfecGenerator` does
(its unit tests ported), every single loss in a frame of 1..48 packets comes back bit-exact,
two losses wherever the masks allow, and malformed FEC raises ValueError only.

Protection factors: libwebrtc's loss-protection table (`kFecRateTable`, media_opt_util.cc) gives
40/255 (16 % of all packets) for 2 % loss at 720p30, 3 Mbit/s; it raises that to its 20 % floor
(51) and converts it to FEC per media packet (`ConvertFECRate`): 64. The single-loss test runs
26 (10 % of media packets), 51 (20 %) and 64 (25 %, what libwebrtc sends for 2 % loss).
"""

from __future__ import annotations

import os
import random
import struct
import time
from itertools import combinations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.transport.red import unwrap_red, wrap_red
from render_server.transport.ulpfec import FecPacket, FecParams, UlpfecGenerator
from render_server.transport.ulpfec_decoder import UlpfecDecoder, recover
from render_server.transport.ulpfec_header import (
    HEADER_SIZE_L_CLEAR,
    HEADER_SIZE_L_SET,
    parse_fec_header,
    zero_extensions,
)
from render_server.transport.ulpfec_masks import num_fec_packets, packet_masks

SSRC = 835424
VP8_PT, RED_PT, ULPFEC_PT = 96, 116, 117
TYPICAL_FACTORS = (26, 51, 64)  # 10 %, 20 %, 25 % of the media packets: see the docstring


def rtp(
    seq: int,
    payload: bytes,
    *,
    marker: bool = False,
    ts: int = 3000,
    ssrc: int = SSRC,
    pt: int = VP8_PT,
    csrcs: tuple[int, ...] = (),
    extension: bytes | None = None,
    two_byte: bool = False,
    padding: int = 0,
) -> bytes:
    """A serialized RTP packet; `extension`: the elements of a one-byte (or two-byte) header
    extension block, zero-padded to a multiple of four."""
    first = 0x80 | len(csrcs) | (0x10 if extension is not None else 0) | (0x20 if padding else 0)
    out = bytes((first, (0x80 if marker else 0) | pt)) + struct.pack("!HII", seq, ts, ssrc)
    out += b"".join(struct.pack("!I", c) for c in csrcs)
    if extension is not None:
        body = extension + bytes(-len(extension) % 4)
        out += (b"\x10\x00" if two_byte else b"\xbe\xde") + struct.pack("!H", len(body) // 4)
        out += body
    out += payload
    if padding:
        out += bytes(padding - 1) + bytes((padding,))
    return out


def random_frame(
    rng: random.Random, count: int, first_seq: int, ts: int, *, varied: bool = True
) -> list[bytes]:
    """`count` media packets of one frame (marker on the last), sequence numbers from
    `first_seq` (wrapping); sizes up to about 1200 bytes and, where `varied`, CSRCs, header
    extensions and padding here and there, so that every recovered header field is exercised."""
    packets = []
    for i in range(count):
        size = rng.choice((0, 1, 7, rng.randrange(20, 1200), 1150))
        kwargs: dict[str, object] = {}
        if varied:
            if rng.random() < 0.2:
                kwargs["csrcs"] = tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(1, 4)))
            if rng.random() < 0.5:
                kwargs["extension"] = bytes((0x12, 0, 0, 0x51, 0xAB, 0xCD))
            if rng.random() < 0.2:
                kwargs["padding"] = rng.randrange(1, 40)
        packets.append(
            rtp(
                (first_seq + i) & 0xFFFF,
                rng.randbytes(size),
                marker=i == count - 1,
                ts=ts,
                **kwargs,  # type: ignore[arg-type]
            )
        )
    return packets


def protect(generator: UlpfecGenerator, packets: list[bytes]) -> list[FecPacket]:
    fec: list[FecPacket] = []
    for packet in packets:
        generator.add_media_packet(packet)
        fec.extend(generator.fec_packets())
    return fec


def on_the_wire(fec: list[FecPacket], next_seq: int) -> list[bytes]:
    """The FEC packets as the receiver's FEC decoder gets them: RED packets numbered after the
    media, the RED header taken off."""
    return [
        unwrap_red(packet.to_rtp((next_seq + i) & 0xFFFF, RED_PT, ULPFEC_PT), RED_PT)
        for i, packet in enumerate(fec)
    ]


def seq_of(packet: bytes) -> int:
    return int.from_bytes(packet[2:4], "big")


def mask_rows(num_media: int, num_fec: int, mask_type: str = "random") -> list[set[int]]:
    rows = []
    for row in packet_masks(num_media, num_fec, mask_type):  # type: ignore[arg-type]
        bits, width = int.from_bytes(row, "big"), 8 * len(row)
        rows.append({i for i in range(num_media) if bits >> (width - 1 - i) & 1})
    return rows


def peel(rows: list[set[int]], lost_media: set[int], lost_fec: set[int]) -> set[int]:
    """What stays missing after the iterative decoding the masks allow: any FEC packet at hand
    with exactly one of its media packets missing rebuilds it, until none does."""
    missing = set(lost_media)
    usable = [row for j, row in enumerate(rows) if j not in lost_fec]
    progress = True
    while progress:
        progress = False
        for row in usable:
            if len(row & missing) == 1:
                missing -= row
                progress = True
    return missing


# -- counts and masks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("media", "factor", "expected"),
    [
        (10, 0, 0),
        (1, 1, 1),  # at least one where the factor is not 0
        (4, 15, 1),
        (10, 26, 1),
        (10, 51, 2),  # 510 + 128 = 638 >> 8
        (10, 64, 3),  # 640 + 128 = 768 >> 8: rounds half up
        (10, 63, 2),
        (48, 64, 12),
        (48, 255, 48),
        (2, 127, 1),
        (2, 128, 1),
        (3, 128, 2),
    ],
)
def test_num_fec_packets_rounds_as_libwebrtc(media: int, factor: int, expected: int) -> None:
    assert num_fec_packets(media, factor) == expected


# Copied from libwebrtc's fec_private_tables_random.cc / fec_private_tables_bursty.cc
# (kMaskRandomN_K, kMaskBurstyN_K) and fec_private_tables_bursty_unittest.cc (kMaskRandom15_6).
LIBWEBRTC_MASKS = [
    ("random", 1, 1, [0x80, 0x00]),
    ("random", 2, 1, [0xC0, 0x00]),
    ("random", 4, 2, [0xC0, 0x00, 0xB0, 0x00]),
    ("random", 4, 4, [0xC0, 0x00, 0xA0, 0x00, 0x30, 0x00, 0x50, 0x00]),
    ("random", 5, 2, [0xA8, 0x00, 0xD0, 0x00]),
    ("random", 10, 3, [0xA4, 0x40, 0xC9, 0x00, 0x52, 0x80]),
    ("random", 12, 4, [0x8B, 0x20, 0x14, 0xB0, 0x22, 0xD0, 0x45, 0x50]),
    ("bursty", 2, 2, [0x80, 0x00, 0xC0, 0x00]),
    ("bursty", 4, 4, [0x80, 0x00, 0xC0, 0x00, 0x60, 0x00, 0x30, 0x00]),
    ("bursty", 10, 3, [0xC9, 0x00, 0x74, 0x80, 0x92, 0x40]),
    (
        "random",
        15,
        6,
        [0x82, 0x08, 0x41, 0x04, 0x20, 0x82, 0x10, 0x40, 0x08, 0x20, 0x04, 0x10],
    ),
    (
        "bursty",  # beyond 12 media packets both are the interleaved code
        15,
        6,
        [0x82, 0x08, 0x41, 0x04, 0x20, 0x82, 0x10, 0x40, 0x08, 0x20, 0x04, 0x10],
    ),
]


@pytest.mark.parametrize(("mask_type", "media", "fec", "expected"), LIBWEBRTC_MASKS)
def test_masks_are_libwebrtcs_table_entries(
    mask_type: str, media: int, fec: int, expected: list[int]
) -> None:
    assert b"".join(packet_masks(media, fec, mask_type)) == bytes(expected)  # type: ignore[arg-type]


def test_mask_lookups_of_libwebrtcs_table_unit_test() -> None:
    # fec_private_tables_bursty_unittest.cc, TestBurstyLookup / TestRandomLookup
    assert packet_masks(4, 1, "bursty") == (b"\xf0\x00",)
    bursty_12_12 = b"".join(packet_masks(12, 12, "bursty"))
    assert len(bursty_12_12) == 24 and bursty_12_12[0] == 0x80 and bursty_12_12[23] == 0x30


def test_interleaved_masks_from_13_packets_on() -> None:
    rows = packet_masks(17, 2)
    assert rows == (bytes.fromhex("aaaa80000000"), bytes.fromhex("555500000000"))
    assert packet_masks(48, 48)[5] == (1 << 42).to_bytes(6, "big")
    assert all(len(row) == 2 for row in packet_masks(16, 3))


@pytest.mark.parametrize("mask_type", ["random", "bursty"])
def test_every_mask_protects_every_media_packet(mask_type: str) -> None:
    for media in range(1, 49):
        for fec in range(1, media + 1):
            rows = mask_rows(media, fec, mask_type)
            assert len(rows) == fec
            assert set().union(*rows) == set(range(media)), (media, fec)


# -- the wire format --------------------------------------------------------------------------


def test_a_fec_packet_computed_by_hand() -> None:
    first = rtp(1000, b"\x01\x02\x03", ts=0x11223344, ssrc=0xDEADBEEF)
    second = rtp(1001, b"\x10\x20\x30\x40\x50", ts=0x11223344, ssrc=0xDEADBEEF, marker=True)
    generator = UlpfecGenerator(FecParams(protection_factor=128))
    [fec] = protect(generator, [first, second])
    assert fec.payload == bytes.fromhex(
        "00"  # E=0, L=0, P^P=0, X^X=0, CC^CC=0 (the version bits are not carried)
        "80"  # M: 0 ^ 1, PT: 96 ^ 96
        "03e8"  # SN base 1000
        "00000000"  # TS recovery: the same timestamp twice
        "0006"  # length recovery: 3 ^ 5
        "0005"  # protection length: the longer of the two
        "c000"  # kMaskRandom2_1: both packets
        "1122334050"  # 01^10 02^20 03^30 40 50
    )
    assert (fec.ssrc, fec.timestamp, fec.seq_num_base, fec.protected) == (
        0xDEADBEEF,
        0x11223344,
        1000,
        (1000, 1001),
    )
    assert fec.marker is False
    wire = fec.to_rtp(1002, RED_PT, ULPFEC_PT)
    assert wire == bytes.fromhex("8074 03ea 11223344 deadbeef 75") + fec.payload
    header = parse_fec_header(fec.payload)
    assert (header.long_mask, header.header_size, header.protected) == (False, 14, (1000, 1001))
    assert (header.marker_pt_recovery, header.length_recovery, header.protection_length) == (
        0x80,
        6,
        5,
    )
    # either packet comes back from the other and the FEC packet, marker bit included
    assert recover([second], [unwrap_red(wire)]) == {1000: first}
    assert recover([first], [unwrap_red(wire)]) == {1001: second}


def test_libwebrtcs_header_reader_vectors() -> None:
    # ulpfec_header_reader_writer_unittest.cc, ReadsSmallHeader / ReadsLargeHeader
    small = bytes.fromhex("0012abcd 12345678 abcd1122 3344 00000000")
    header = parse_fec_header(small)
    assert (header.header_size, header.seq_num_base, header.mask, header.protection_length) == (
        14,
        0xABCD,
        b"\x33\x44",
        0x1122,
    )
    assert (header.timestamp_recovery, header.length_recovery) == (0x12345678, 0xABCD)
    large = bytes.fromhex("4012abcd 12345678 abcd1122 33445566 7788 00000000")
    header = parse_fec_header(large)
    assert (header.long_mask, header.header_size, header.mask) == (
        True,
        18,
        bytes.fromhex("334455667788"),
    )
    assert header.seq_num_base == 0xABCD and header.protection_length == 0x1122
    # the decoder drops them: 0x1122 bytes protected, 4 present
    with pytest.raises(ValueError, match="truncated"):
        UlpfecDecoder().add_fec_packet(rtp(1, small, pt=ULPFEC_PT))


@pytest.mark.parametrize(("gap", "long_mask"), [(15, False), (16, True), (47, True)])
def test_l_bit_follows_the_sequence_number_span(gap: int, long_mask: bool) -> None:
    first, last = rtp(100, b"abc"), rtp(100 + gap, b"defgh", marker=True)
    [fec] = protect(UlpfecGenerator(FecParams(128)), [first, last])
    header = parse_fec_header(fec.payload)
    assert header.long_mask is long_mask
    assert fec.payload[0] & 0xC0 == (0x40 if long_mask else 0)  # E = 0
    size = HEADER_SIZE_L_SET if long_mask else HEADER_SIZE_L_CLEAR
    assert header.header_size == size and len(fec.payload) == size + 5
    assert header.protected == (100, 100 + gap)
    assert recover([last], on_the_wire([fec], 101 + gap)) == {100: first}


def test_no_fec_where_the_span_exceeds_48_sequence_numbers() -> None:
    # rtp_fec_unittest.cc, Will(Not)ProtectMediaPacketsWith(TooLarge)SequenceNumberGap
    generator = UlpfecGenerator(FecParams(127, "bursty"))
    assert protect(generator, [rtp(1, b"a"), rtp(48, b"b", marker=True)])
    assert not protect(generator, [rtp(1, b"a"), rtp(49, b"b", marker=True)])
    assert generator.pending_media_packets == 0


# -- the generator (ulpfec_generator_unittest.cc) ---------------------------------------------


def test_one_frame_fec() -> None:
    generator = UlpfecGenerator(FecParams(15, "random", max_fec_frames=3))
    frame = [rtp(i, bytes(10), ts=9000, marker=i == 3) for i in range(4)]
    for packet in frame[:3]:
        generator.add_media_packet(packet)
        assert generator.fec_packets() == []
    generator.add_media_packet(frame[3])
    [fec] = generator.fec_packets()
    assert generator.fec_packets() == []
    wire = fec.to_rtp(4, RED_PT, ULPFEC_PT)
    assert wire[1] == RED_PT  # marker clear
    assert seq_of(wire) == 4 and int.from_bytes(wire[4:8], "big") == 9000
    assert wire[12] == ULPFEC_PT  # the RED header right after a 12-byte RTP header


def test_two_frame_fec() -> None:
    generator = UlpfecGenerator(FecParams(15, max_fec_frames=3))
    # one frame of two packets: 1 FEC packet is 128/256 overhead, 113 over the target: no FEC
    assert protect(generator, [rtp(0, bytes(10), ts=0), rtp(1, bytes(10), ts=0, marker=True)]) == []
    second = [rtp(2, bytes(10), ts=3000), rtp(3, bytes(10), ts=3000, marker=True)]
    [fec] = protect(generator, second)
    assert fec.timestamp == 3000 and fec.protected == (0, 1, 2, 3)


def test_mixed_media_rtp_header_lengths() -> None:
    generator = UlpfecGenerator(FecParams(127, max_fec_frames=1))
    for i in range(48):
        generator.add_media_packet(rtp(i, bytes(10)))
        assert generator.fec_packets() == []
    # the 49th packet is not protected (the buffer is full), but it ends the frame
    generator.add_media_packet(rtp(48, b"", csrcs=(1,), marker=True))
    fec = generator.fec_packets()
    assert len(fec) == num_fec_packets(48, 127)
    for i, packet in enumerate(fec):
        assert 48 not in packet.protected
        # the header is the last protected packet's: 12 bytes, the RED header right after
        assert packet.to_rtp(49 + i, RED_PT, ULPFEC_PT)[12] == ULPFEC_PT


def test_updates_protection_parameters() -> None:
    key, delta = FecParams(25, max_fec_frames=2), FecParams(25, max_fec_frames=5)
    generator = UlpfecGenerator(delta, key)
    assert generator.params == FecParams()  # nothing applies before the first packet
    seq = iter(range(100))

    def add_frame(keyframe: bool) -> list[FecPacket]:
        generator.add_media_packet(rtp(next(seq), bytes(10), marker=True), keyframe=keyframe)
        return generator.fec_packets()

    assert add_frame(True) == [] and generator.params == key
    assert add_frame(False) != []  # two frames: the key frame's max_fec_frames
    assert generator.params == delta
    assert add_frame(False) == [] and add_frame(False) == []
    assert add_frame(True) != []  # a key frame switches to its parameters at once
    generator.set_params(FecParams(0))
    assert generator.params == delta  # new parameters wait for the next packet
    assert add_frame(False) == [] and generator.params == FecParams(0)


def test_no_empty_fec_with_sequence_number_gaps() -> None:
    layout = [(15, 3, 41), (14, 1, 43), (19, 0, 48), (19, 0, 50), (14, 3, 51)]
    layout += [(13, 8, 52), (19, 2, 53), (12, 3, 54), (21, 0, 55), (13, 3, 57)]
    generator = UlpfecGenerator(FecParams(117, "bursty", max_fec_frames=3))
    packets = []
    for header_size, payload_size, seq in layout:
        # a header extension of about the size libwebrtc's test allocates (`kRtpExtensionMid`)
        length = max(1, header_size - 17)
        extension = bytes((0x10 | (length - 1),)) + bytes(length) if header_size > 12 else None
        packets.append(rtp(seq, bytes(payload_size), marker=seq == 57, extension=extension))
    fec = protect(generator, packets)
    assert len(fec) == num_fec_packets(10, 117)
    for made in fec:
        header = parse_fec_header(made.payload)
        assert header.long_mask and header.seq_num_base == 41  # 41..57: 17 sequence numbers
        assert header.protected and len(made.payload) > HEADER_SIZE_L_SET
    wire = on_the_wire(fec, 58)
    for lost in packets:
        assert recover([p for p in packets if p is not lost], wire) == {seq_of(lost): lost}


@pytest.mark.parametrize(("factor", "fec_after_frames"), [(80, 2), (100, 4)])
def test_more_media_packets_above_the_high_protection_threshold(
    factor: int, fec_after_frames: int
) -> None:
    generator = UlpfecGenerator(FecParams(factor, max_fec_frames=10))
    for frame in range(1, 6):
        generator.add_media_packet(rtp(frame, bytes(100), ts=frame * 3000, marker=True))
        if generator.fec_packets():
            break
    assert frame == fec_after_frames


def test_a_frame_completes_a_batch_only_with_its_marker() -> None:
    generator = UlpfecGenerator(FecParams(255))
    for i in range(47):
        generator.add_media_packet(rtp(i, bytes(50)))
        assert generator.fec_payloads() == []
    generator.add_media_packet(rtp(47, bytes(50), marker=True))
    assert len(generator.fec_payloads()) == 48


def test_max_fec_packets_caps_a_batch() -> None:
    rng = random.Random(7)
    frame = random_frame(rng, 40, 500, 0)
    fec = protect(UlpfecGenerator(FecParams(255), max_fec_packets=4), frame)
    assert [packet.protected for packet in fec] == [
        tuple(500 + i for i in range(40) if i % 4 == row) for row in range(4)
    ]
    wire = on_the_wire(fec, 540)
    assert recover(frame[1:], wire) == {500: frame[0]}


def test_a_discontinuity_starts_a_new_batch() -> None:
    generator = UlpfecGenerator(FecParams(128))
    generator.add_media_packet(rtp(10, b"a"))
    generator.add_media_packet(rtp(10, b"b"))  # not newer: the first is left unprotected
    generator.add_media_packet(rtp(11, b"c", ssrc=SSRC + 1))  # another SSRC: likewise
    generator.add_media_packet(rtp(12, b"d", ssrc=SSRC + 1, marker=True))
    [fec] = generator.fec_packets()
    assert fec.protected == (11, 12) and fec.ssrc == SSRC + 1


def test_invalid_input_to_the_generator() -> None:
    generator = UlpfecGenerator(FecParams(64))
    with pytest.raises(ValueError):
        generator.add_media_packet(b"\x80\x60")
    assert generator.pending_media_packets == 0
    with pytest.raises(ValueError):
        FecParams(256)
    with pytest.raises(ValueError):
        FecParams(10, "gilbert")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        UlpfecGenerator(max_fec_packets=0)
    with pytest.raises(ValueError):
        num_fec_packets(4, -1)


def test_to_rtp_keeps_the_last_media_header() -> None:
    media = rtp(7, b"xyz", csrcs=(5,), extension=b"\x10\xaa", padding=3, marker=True, ts=77)
    [fec] = protect(UlpfecGenerator(FecParams(255)), [media])
    wire = fec.to_rtp(8, RED_PT, ULPFEC_PT)
    assert wire[0] == 0x80 | 0x10 | 1  # no padding; extension and CSRC count kept
    assert wire[1] == RED_PT and seq_of(wire) == 8
    assert wire[2:24] != media[2:24] and wire[4:24] == media[4:24]  # ts, SSRC, CSRC, extension
    assert wire[24:] == bytes((ULPFEC_PT,)) + fec.payload
    bare = fec.to_rtp(8, RED_PT, ULPFEC_PT, keep_extensions=False)
    assert bare[0] == 0x81 and bare[12:16] == media[12:16] and bare[16] == ULPFEC_PT
    assert recover([], [unwrap_red(bare)]) == {7: media}


# -- recovery -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mask_type", ["random", "bursty"])
@pytest.mark.parametrize("factor", TYPICAL_FACTORS)
def test_every_single_loss_is_recovered_bit_exactly(factor: int, mask_type: str) -> None:
    rng = random.Random(factor * 7 + len(mask_type))
    seq = 65000  # wraps past 65535 along the way
    for count in range(1, 49):
        frame = random_frame(rng, count, seq, ts=count * 3000)
        generator = UlpfecGenerator(FecParams(factor, mask_type))  # type: ignore[arg-type]
        fec = protect(generator, frame)
        assert len(fec) == num_fec_packets(count, factor)
        wire = on_the_wire(fec, seq + count)
        for lost in range(count):
            received = frame[:lost] + frame[lost + 1 :]
            assert recover(received, wire) == {seq_of(frame[lost]): frame[lost]}, (count, lost)
        seq = (seq + count + len(fec)) & 0xFFFF


@pytest.mark.parametrize(
    ("count", "factor", "mask_type"),
    [(2, 255, "random"), (4, 128, "random"), (4, 255, "bursty"), (6, 64, "random")]
    + [(10, 64, "random"), (10, 64, "bursty"), (12, 128, "random"), (20, 64, "random")],
)
def test_two_losses_are_recovered_where_the_masks_allow(
    count: int, factor: int, mask_type: str
) -> None:
    rng = random.Random(count * factor)
    frame = random_frame(rng, count, 40000, ts=1234)
    fec = protect(UlpfecGenerator(FecParams(factor, mask_type)), frame)  # type: ignore[arg-type]
    wire = on_the_wire(fec, 40000 + count)
    rows = mask_rows(count, len(fec), mask_type)
    recovered_pairs = 0
    for lost in combinations(range(count + len(fec)), 2):
        lost_media = {i for i in lost if i < count}
        lost_fec = {i - count for i in lost if i >= count}
        if not lost_media:
            continue
        expected = lost_media - peel(rows, lost_media, lost_fec)
        got = recover(
            [p for i, p in enumerate(frame) if i not in lost_media],
            [p for j, p in enumerate(wire) if j not in lost_fec],
        )
        assert got == {seq_of(frame[i]): frame[i] for i in expected}, lost
        recovered_pairs += len(lost_media) == 2 and expected == lost_media
    if len(fec) >= 2:
        assert recovered_pairs > 0  # the masks do allow some double media losses


def test_fifty_percent_protection_from_libwebrtcs_unit_tests() -> None:
    # rtp_fec_unittest.cc, FecRecoveryWithLoss50percRandomMask / ...BurstyMask: 4 media, 4 FEC
    rng = random.Random(50)
    frame = random_frame(rng, 4, 10, ts=0)

    def complete(mask_type: str, lost_media: set[int], lost_fec: set[int]) -> bool:
        fec = protect(UlpfecGenerator(FecParams(255, mask_type)), frame)  # type: ignore[arg-type]
        assert len(fec) == 4
        wire = [p for j, p in enumerate(on_the_wire(fec, 14)) if j not in lost_fec]
        got = recover([p for i, p in enumerate(frame) if i not in lost_media], wire)
        assert all(got[seq_of(frame[i])] == frame[i] for i in lost_media if seq_of(frame[i]) in got)
        return len(got) == len(lost_media)

    assert complete("random", {0, 2, 3}, {0})
    assert not complete("random", {0, 1, 2, 3}, set())
    assert complete("bursty", {0, 1, 2, 3}, set())
    assert complete("bursty", {1, 2, 3}, {0})
    assert not complete("bursty", {0, 3}, {0, 3})


def test_a_recovered_packet_helps_recover_the_next() -> None:
    # kMaskRandom4_2: FEC 0 protects media 0, 1; FEC 1 media 0, 2, 3
    rng = random.Random(42)
    frame = random_frame(rng, 4, 300, ts=0)
    fec = protect(UlpfecGenerator(FecParams(128)), frame)
    assert [packet.protected for packet in fec] == [(300, 301), (300, 302, 303)]
    wire = on_the_wire(fec, 304)
    decoder = UlpfecDecoder()
    assert decoder.add_fec_packet(wire[0]) == []
    assert decoder.add_media_packet(frame[2]) == []
    assert decoder.add_media_packet(frame[3]) == []
    assert decoder.add_fec_packet(wire[1]) == [frame[0], frame[1]]  # 0 from FEC 1, then 1
    assert decoder.add_fec_packet(wire[1]) == []  # duplicates change nothing
    assert decoder.add_media_packet(frame[1]) == []


def test_arrival_order_does_not_matter() -> None:
    rng = random.Random(3)
    frame = random_frame(rng, 12, 65530, ts=0)
    fec = protect(UlpfecGenerator(FecParams(64)), frame)
    wire = on_the_wire(fec, 65542)
    for lost in (0, 5, 11):
        arrivals = [p for i, p in enumerate(frame) if i != lost] + wire
        rng.shuffle(arrivals)
        decoder = UlpfecDecoder()
        out = []
        for packet in arrivals:
            if packet[1] & 0x7F == ULPFEC_PT:
                out += decoder.add_fec_packet(packet)
            else:
                out += decoder.add_media_packet(packet)
        # a packet not yet arrived may be rebuilt before it comes (as in libwebrtc)
        assert frame[lost] in out
        assert len({seq_of(p) for p in out}) == len(out)
        assert all(p == frame[(seq_of(p) - 65530) & 0xFFFF] for p in out)


def test_fec_over_two_frames_recovers_the_timestamp() -> None:
    generator = UlpfecGenerator(FecParams(51, max_fec_frames=2))
    rng = random.Random(9)
    first = random_frame(rng, 2, 700, ts=90000)
    second = random_frame(rng, 2, 702, ts=93000)
    assert protect(generator, first) == []  # one FEC packet over 2 media is 256/2: too much
    fec = protect(generator, second)
    assert [packet.timestamp for packet in fec] == [93000]
    assert recover(first[1:] + second, on_the_wire(fec, 704)) == {700: first[0]}


def test_the_whole_path_through_red() -> None:
    rng = random.Random(11)
    frame = random_frame(rng, 10, 5000, ts=0)
    fec = protect(UlpfecGenerator(FecParams(64)), frame)
    red_media = [wrap_red(packet, RED_PT) for packet in frame]
    red_fec = [packet.to_rtp(5010 + i, RED_PT, ULPFEC_PT) for i, packet in enumerate(fec)]
    decoder = UlpfecDecoder(SSRC)
    out = []
    for packet in red_media[:4] + red_media[5:] + red_fec:
        out += decoder.add_red_packet(packet, ULPFEC_PT)
    assert out == [frame[4]]


# -- header extensions the sender writes after FEC ----------------------------------------------


def test_zero_extensions_in_both_forms() -> None:
    one_byte = rtp(1, b"pay", extension=b"\x31\x01\x02" + b"\x00" + b"\x52\x0a\x0b\x0c")
    assert zero_extensions(one_byte, {3}) == rtp(
        1, b"pay", extension=b"\x31\x00\x00" + b"\x00" + b"\x52\x0a\x0b\x0c"
    )
    assert zero_extensions(one_byte, {5, 3}) == rtp(1, b"pay", extension=b"\x31\0\0\0\x52\0\0\0")
    assert zero_extensions(one_byte, {7}) is one_byte
    two_byte = rtp(1, b"pay", extension=b"\x03\x02\xaa\xbb\x00\x05\x01\xcc", two_byte=True)
    assert zero_extensions(two_byte, {3}) == rtp(
        1, b"pay", extension=b"\x03\x02\x00\x00\x00\x05\x01\xcc", two_byte=True
    )
    assert zero_extensions(two_byte, {5}) == rtp(
        1, b"pay", extension=b"\x03\x02\xaa\xbb\x00\x05\x01\x00", two_byte=True
    )
    with pytest.raises(ValueError):
        zero_extensions(b"\x90\x00", {3})


def test_extensions_written_after_fec_must_be_zeroed_in_the_generator() -> None:
    rng = random.Random(5)
    abs_send_time, transport_cc = 3, 5

    def packet(seq: int, marker: bool) -> bytes:
        # transport-cc (2 bytes) first, as header_extensions.py writes it, then abs-send-time
        elements = bytes((0x51, *rng.randbytes(2), 0x32, *rng.randbytes(3)))
        return rtp(seq, rng.randbytes(rng.randrange(50, 1200)), extension=elements, marker=marker)

    frame = [packet(20 + i, i == 5) for i in range(6)]
    ids = {abs_send_time, transport_cc}
    seen = [zero_extensions(p, ids) for p in frame]  # what Chromium's FEC decoder stores
    right = on_the_wire(protect(UlpfecGenerator(FecParams(64), zero_extension_ids=ids), frame), 26)
    assert recover(frame[1:], right, zero_extension_ids=ids) == {20: seen[0]}
    wrong = on_the_wire(protect(UlpfecGenerator(FecParams(64)), frame), 26)
    assert recover(frame[1:], wrong, zero_extension_ids=ids) != {20: seen[0]}


# -- the decoder's guards -----------------------------------------------------------------------


def test_the_decoder_refuses_what_libwebrtc_drops() -> None:
    rng = random.Random(1)
    frame = random_frame(rng, 3, 1, ts=0)
    [wire] = on_the_wire(protect(UlpfecGenerator(FecParams(64)), frame), 4)
    decoder = UlpfecDecoder(SSRC)
    with pytest.raises(ValueError, match="SSRC"):
        decoder.add_media_packet(rtp(1, b"x", ssrc=SSRC + 1))
    zero_mask = bytearray(wire)
    zero_mask[24:26] = b"\0\0"
    with pytest.raises(ValueError, match="all-zero mask"):
        decoder.add_fec_packet(bytes(zero_mask))
    with pytest.raises(ValueError, match="truncated"):
        decoder.add_fec_packet(wire[:-1])
    with pytest.raises(ValueError, match="truncated"):
        decoder.add_fec_packet(wire[:20])
    too_long = rtp(9, bytes.fromhex("0000000100000000000005d0 8000") + bytes(1488))
    with pytest.raises(ValueError, match="longer than an IP packet"):
        decoder.add_fec_packet(too_long)
    # none of it stuck: the decoder still works
    assert decoder.add_media_packet(frame[0]) == [] and decoder.add_media_packet(frame[2]) == []
    assert decoder.add_fec_packet(wire) == [frame[1]]


def test_a_jump_past_the_tracked_window_resets_the_decoder() -> None:
    decoder = UlpfecDecoder()
    for seq in range(192):
        decoder.add_media_packet(rtp(seq, b"m"))
    rng = random.Random(2)
    frame = random_frame(rng, 2, 1000, ts=0)
    wire = on_the_wire(protect(UlpfecGenerator(FecParams(255)), frame), 1002)
    assert decoder.add_media_packet(frame[0]) == []
    assert decoder.add_fec_packet(wire[0]) == [frame[1]]


# -- fuzz ---------------------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_arbitrary_fec_payloads_raise_value_error_only(payload: bytes) -> None:
    try:
        parse_fec_header(payload)
    except ValueError:
        pass
    decoder = UlpfecDecoder()
    decoder.add_media_packet(rtp(0, b"media", marker=True))
    try:
        out = decoder.add_fec_packet(rtp(1, payload, pt=ULPFEC_PT))
    except ValueError:
        return
    assert all(isinstance(packet, bytes) and len(packet) >= 12 for packet in out)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120), st.integers(0, 127))
def test_arbitrary_packets_raise_value_error_only(data: bytes, ulpfec_pt: int) -> None:
    for call in (
        lambda: UlpfecDecoder().add_red_packet(data, ulpfec_pt),
        lambda: UlpfecDecoder().add_media_packet(data),
        lambda: UlpfecDecoder().add_fec_packet(data),
        lambda: UlpfecGenerator(FecParams(255)).add_media_packet(data),
        lambda: zero_extensions(data, {1, 2, 3}),
    ):
        try:
            call()
        except ValueError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20), st.randoms(use_true_random=False), st.data())
def test_corrupted_fec_packets_raise_value_error_only(
    count: int, rng: random.Random, data: st.DataObject
) -> None:
    frame = random_frame(rng, count, rng.randrange(65536), ts=0)
    wire = on_the_wire(protect(UlpfecGenerator(FecParams(255)), frame), 0)
    decoder = UlpfecDecoder()
    for packet in frame[1:]:
        decoder.add_media_packet(packet)
    for packet in wire:
        corrupt = bytearray(packet)
        for _ in range(data.draw(st.integers(1, 4))):
            corrupt[data.draw(st.integers(12, len(corrupt) - 1))] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(12, len(corrupt)))
        try:
            out = decoder.add_fec_packet(bytes(corrupt[:cut]))
        except ValueError:
            continue
        assert all(isinstance(p, bytes) and 12 <= len(p) <= 1488 for p in out)


def test_generating_costs_microseconds_per_packet() -> None:
    packets = [
        rtp(i, os.urandom(1150), marker=i % 10 == 9, ts=i // 10, extension=b"\x51\0\0\x32\1\2\3")
        for i in range(3000)
    ]
    generator = UlpfecGenerator(FecParams(64), zero_extension_ids={3, 5})
    start = time.perf_counter()
    made = 0
    for packet in packets:
        generator.add_media_packet(packet)
        made += len(generator.fec_packets())
    elapsed = time.perf_counter() - start
    assert made == 300 * 3
    assert elapsed < 1.0  # 10 s of 720p30 at 3 Mbit/s; about 25 ms on a laptop core
