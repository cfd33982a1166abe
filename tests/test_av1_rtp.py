"""The AV1 RTP payload format: aggregation headers, element lengths, fragments, the N bit, its
inverse, malformed input, and a 4K SVT-AV1 keyframe that must come back bit-exact."""

from __future__ import annotations

import fractions

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.transport.av1_rtp import (
    TEMPORAL_DELIMITER,
    av1_payload_starts_keyframe,
    depacketize_av1,
    leb128,
    packetize_av1,
    read_leb128,
)

SEQUENCE_HEADER, FRAME_HEADER, TILE_GROUP, METADATA, FRAME = 1, 3, 4, 5, 6
TILE_LIST, PADDING = 8, 15
KEY_FRAME_START = 0x10  # show_existing_frame 0, frame_type KEY_FRAME, show_frame 1
INTER_FRAME_START = 0x30  # frame_type INTER_FRAME


def obu(kind: int, payload: bytes, extension: int | None = None, sized: bool = True) -> bytes:
    """An OBU as an encoder writes it (with `obu_size` unless `sized` is False)."""
    header = kind << 3 | (0x04 if extension is not None else 0) | (0x02 if sized else 0)
    head = bytes([header]) + (bytes([extension]) if extension is not None else b"")
    return head + (leb128(len(payload)) if sized else b"") + payload


def unsized(kind: int, payload: bytes, extension: int | None = None) -> bytes:
    """The same OBU as it travels in an OBU element."""
    return obu(kind, payload, extension, sized=False)


def keyframe_unit(frame_size: int = 40) -> bytes:
    frame = bytes([KEY_FRAME_START]) + bytes(i & 0xFF for i in range(frame_size - 1))
    return TEMPORAL_DELIMITER + obu(SEQUENCE_HEADER, b"\x00" * 10) + obu(FRAME, frame)


def z(payload: bytes) -> bool:
    return bool(payload[0] & 0x80)


def y(payload: bytes) -> bool:
    return bool(payload[0] & 0x40)


def w(payload: bytes) -> int:
    return (payload[0] >> 4) & 0x03


def n(payload: bytes) -> bool:
    return bool(payload[0] & 0x08)


def elements(payload: bytes) -> list[bytes]:
    """The OBU elements of a payload, read independently of the module under test."""
    count, pos, out = w(payload), 1, []
    while pos < len(payload):
        if count and len(out) == count - 1:
            out.append(payload[pos:])
            break
        size, pos = read_leb128(payload, pos)
        out.append(payload[pos : pos + size])
        pos += size
    return out


# -- aggregation ---------------------------------------------------------------------------------


def test_a_small_keyframe_is_one_packet_two_elements_the_last_without_length() -> None:
    unit = keyframe_unit(40)
    (payload,) = packetize_av1(unit)
    assert (z(payload), y(payload), w(payload), n(payload)) == (False, False, 2, True)
    assert payload[0] & 0x07 == 0  # the reserved bits
    sequence = unsized(SEQUENCE_HEADER, b"\x00" * 10)
    frame = unsized(FRAME, unit[-40:])
    # the first element has its length, the last none; the TD is gone; obu_size is gone
    assert payload[1:] == leb128(len(sequence)) + sequence + frame
    assert elements(payload) == [sequence, frame]
    assert depacketize_av1([payload]) == unit


def test_more_than_three_obus_set_w_to_zero_and_every_element_has_its_length() -> None:
    metadata = [obu(METADATA, bytes([i]) * (5 + i)) for i in range(5)]
    unit = TEMPORAL_DELIMITER + b"".join(metadata)
    (payload,) = packetize_av1(unit)
    assert w(payload) == 0 and not (z(payload) or y(payload) or n(payload))
    expected = b"".join(
        leb128(len(e)) + e for e in (unsized(METADATA, bytes([i]) * (5 + i)) for i in range(5))
    )
    assert payload[1:] == expected
    assert depacketize_av1([payload]) == unit


def test_three_obus_keep_w() -> None:
    unit = b"".join(obu(METADATA, b"m" * 3) for _ in range(3))
    (payload,) = packetize_av1(unit)
    assert w(payload) == 3 and len(elements(payload)) == 3


def test_an_obu_too_large_for_a_packet_is_split_with_z_and_y() -> None:
    unit = TEMPORAL_DELIMITER + obu(FRAME, bytes([INTER_FRAME_START]) + b"x" * 2999)
    payloads = packetize_av1(unit, max_payload=1200)
    assert len(payloads) == 3 and all(len(p) <= 1200 for p in payloads)
    flags = [(z(p), y(p), w(p), n(p)) for p in payloads]
    assert flags == [(False, True, 1, False), (True, True, 1, False), (True, False, 1, False)]
    assert b"".join(p[1:] for p in payloads) == unsized(FRAME, unit[-3000:])
    assert depacketize_av1(payloads) == unit


def test_small_obus_share_a_packet_with_the_start_and_end_of_large_ones() -> None:
    big = bytes([INTER_FRAME_START]) + b"b" * 1500
    unit = obu(METADATA, b"a" * 20) + obu(FRAME, big) + obu(METADATA, b"c" * 20)
    payloads = packetize_av1(unit, max_payload=1000)
    assert len(payloads) == 2
    first, second = payloads
    assert len(first) == 1000  # filled before the next one starts
    assert (z(first), y(first), w(first)) == (False, True, 2)
    assert (z(second), y(second), w(second)) == (True, False, 2)
    assert elements(first)[0] == unsized(METADATA, b"a" * 20)
    assert elements(second)[1] == unsized(METADATA, b"c" * 20)
    assert elements(first)[1] + elements(second)[0] == unsized(FRAME, big)
    assert depacketize_av1(payloads) == TEMPORAL_DELIMITER + unit


def test_the_new_sequence_bit_only_on_the_first_packet_of_a_keyframe_with_its_sequence_header() -> (
    None
):
    payloads = packetize_av1(keyframe_unit(5000), max_payload=1200)
    assert [n(p) for p in payloads] == [True] + [False] * (len(payloads) - 1)
    assert [av1_payload_starts_keyframe(p) for p in payloads] == [n(p) for p in payloads]
    inter = obu(FRAME, bytes([INTER_FRAME_START]) + b"i" * 30)
    assert not any(n(p) for p in packetize_av1(obu(SEQUENCE_HEADER, b"\x00" * 10) + inter))
    key_alone = obu(FRAME, bytes([KEY_FRAME_START]) + b"k" * 30)  # no sequence header
    assert not any(n(p) for p in packetize_av1(TEMPORAL_DELIMITER + key_alone))
    shown = obu(FRAME_HEADER, bytes([0x80 | 0x02]))  # show_existing_frame: not a new sequence
    assert not any(n(p) for p in packetize_av1(obu(SEQUENCE_HEADER, b"\x00" * 10) + shown))
    still = obu(SEQUENCE_HEADER, bytes([0x18]) + b"\x00" * 4)  # reduced_still_picture_header
    assert n(packetize_av1(still + obu(FRAME, b"\x00" * 8))[0])


def test_temporal_delimiters_tile_lists_and_padding_are_not_sent() -> None:
    frame = obu(FRAME, bytes([INTER_FRAME_START]) + b"f" * 10)
    unit = TEMPORAL_DELIMITER + obu(PADDING, b"\x00" * 30) + frame + obu(TILE_LIST, b"t" * 9)
    (payload,) = packetize_av1(unit)
    assert elements(payload) == [unsized(FRAME, frame[2:])]
    assert packetize_av1(TEMPORAL_DELIMITER) == []
    assert depacketize_av1([payload]) == TEMPORAL_DELIMITER + frame


def test_extension_headers_are_kept_and_a_last_obu_without_size_is_read_to_the_end() -> None:
    extension = 0b001_01_000  # temporal_id 1, spatial_id 1
    frame = bytes([INTER_FRAME_START]) + b"e" * 2000
    unit = obu(FRAME_HEADER, b"h" * 4, extension) + obu(TILE_GROUP, frame, extension, sized=False)
    payloads = packetize_av1(unit, max_payload=300)
    first = elements(payloads[0])
    assert first[0] == unsized(FRAME_HEADER, b"h" * 4, extension)
    assert first[1][:2] == bytes([TILE_GROUP << 3 | 0x04, extension])
    assert depacketize_av1(payloads) == TEMPORAL_DELIMITER + obu(
        FRAME_HEADER, b"h" * 4, extension
    ) + obu(TILE_GROUP, frame, extension)


def test_a_three_obu_packet_that_takes_a_fourth_gives_every_element_a_length() -> None:
    small = b"".join(obu(METADATA, bytes([i]) * 2) for i in range(3))
    unit = small + obu(FRAME, bytes([INTER_FRAME_START]) + b"x" * 400)
    payloads = packetize_av1(unit, max_payload=200)
    first = payloads[0]
    assert (w(first), y(first), len(first)) == (0, True, 200)
    assert [len(e) for e in elements(first)] == [3, 3, 3, 200 - 1 - 3 * 4 - 2]
    assert depacketize_av1(payloads) == TEMPORAL_DELIMITER + unit


obu_lists = st.lists(
    st.tuples(
        st.sampled_from([SEQUENCE_HEADER, FRAME_HEADER, TILE_GROUP, METADATA, FRAME]),
        st.integers(0, 700),
        st.none() | st.integers(0, 255),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(obu_lists, st.sampled_from([2, 3, 4, 5, 17, 128, 130, 300, 1200]))
def test_every_payload_fits_and_the_unit_comes_back(
    spec: list[tuple[int, int, int | None]], max_payload: int
) -> None:
    unit = TEMPORAL_DELIMITER + b"".join(
        obu(kind, bytes((size + i) & 0xFF for i in range(size)), ext) for kind, size, ext in spec
    )
    payloads = packetize_av1(unit, max_payload)
    assert payloads and all(1 < len(p) <= max_payload for p in payloads)
    assert not z(payloads[0]) and not y(payloads[-1])
    for before, after in zip(payloads, payloads[1:], strict=False):
        assert y(before) == z(after)
    for p in payloads:
        assert w(p) in (0, 1, 2, 3) and (w(p) == 0) == (len(elements(p)) > 3)
        assert all(elements(p))
    assert depacketize_av1(payloads) == unit


def test_packetize_refuses_malformed_units_and_tiny_payloads() -> None:
    with pytest.raises(ValueError, match="at least 2 bytes"):
        packetize_av1(keyframe_unit(), max_payload=1)
    with pytest.raises(ValueError, match="declares 9 bytes"):
        packetize_av1(bytes([FRAME << 3 | 0x02, 9]) + b"abc")
    with pytest.raises(ValueError, match="forbidden bit"):
        packetize_av1(bytes([0x80 | FRAME << 3 | 0x02, 0]))
    with pytest.raises(ValueError, match="truncated"):
        packetize_av1(bytes([FRAME << 3 | 0x02, 0x80]))


# -- malformed input on the receiving side ------------------------------------------------------


@pytest.mark.parametrize(
    ("payloads", "message"),
    [
        ([], "no AV1 RTP payload"),
        ([b""], "payload 0 is empty"),
        ([b"\x00"], "no OBU element"),
        ([bytes([0x90]) + b"\x30a"], "continues an OBU"),  # Z on the first payload
        ([bytes([0x50]) + b"\x30a"], "leaves its OBU unfinished"),  # Y on the last
        ([bytes([0x50]) + b"\x30a", bytes([0x10]) + b"\x30b"], "unfinished"),  # Y then no Z
        ([bytes([0x00, 0xFF])], "truncated LEB128"),
        ([bytes([0x00]) + b"\xff" * 9], "runs past 8 bytes"),
        ([bytes([0x00]) + b"\xff\xff\xff\xff\x7f"], "exceeds 2\\^32"),
        ([bytes([0x00, 0x09]) + b"\x30abc"], "declares 9 bytes, 4 remain"),
        ([bytes([0x30, 0x02]) + b"\x30a"], "1 OBU elements, W says 3"),
        ([bytes([0x98]) + b"\x30a"], "begins a coded video sequence with a fragment"),
        ([bytes([0x10]) + b"\xb0a"], "forbidden bit"),
        ([bytes([0x10]) + bytes([FRAME << 3 | 0x04])], "extension header"),
        ([bytes([0x10]) + bytes([FRAME << 3 | 0x02, 5]) + b"ab"], "declares 5 bytes and has 2"),
        ([bytes([0x10])], "an empty OBU"),
    ],
)
def test_malformed_payloads_are_refused_with_a_reason(payloads: list[bytes], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        depacketize_av1(payloads)


def test_a_payload_with_obu_size_kept_and_temporal_delimiters_sent_anyway_is_accepted() -> None:
    frame = obu(FRAME, bytes([INTER_FRAME_START]) + b"s" * 20)
    payload = bytes([0x20]) + leb128(2) + TEMPORAL_DELIMITER + frame  # W=2, sizes kept
    assert depacketize_av1([payload]) == TEMPORAL_DELIMITER + frame


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=4))
def test_garbage_gives_a_unit_or_a_value_error(payloads: list[bytes]) -> None:
    try:
        unit = depacketize_av1(payloads)
    except ValueError:
        return
    assert unit.startswith(TEMPORAL_DELIMITER)


def test_the_keyframe_test_needs_n_without_z() -> None:
    assert av1_payload_starts_keyframe(bytes([0x18, 0x00]))
    assert not av1_payload_starts_keyframe(bytes([0x98, 0x00]))
    assert not av1_payload_starts_keyframe(bytes([0x10, 0x00]))
    assert not av1_payload_starts_keyframe(b"")


# -- a real encoder at 4K --------------------------------------------------------------------------


def encode_av1(width: int, height: int, count: int, bit_rate: int = 8_000_000) -> list[av.Packet]:
    """`count` frames of a moving, textured picture from libsvtav1 in its low-delay setup: the
    first a keyframe with its sequence header, the rest inter frames; pts in 1/90000."""
    encoder = av.CodecContext.create("libsvtav1", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
    encoder.time_base = fractions.Fraction(1, 90000)
    encoder.framerate = fractions.Fraction(30)
    encoder.bit_rate = bit_rate
    encoder.max_b_frames = 0
    # SVT-AV1's low delay (pred-struct=1) takes constant bit rate (rc=2) only
    encoder.options = {"preset": "12", "svtav1-params": "pred-struct=1:rc=2:lookahead=0:keyint=-1"}
    rows, cols = np.arange(height, dtype=np.int32), np.arange(width, dtype=np.int32)
    texture = (np.add.outer(rows * 7, cols * 3) % 251).astype(np.uint8)
    rng = np.random.default_rng(1)
    texture[: height // 4] = rng.integers(0, 255, (height // 4, width), dtype=np.uint8)
    packets = []
    for i in range(count):
        image = np.full((height * 3 // 2, width), 128, np.uint8)
        image[:height] = np.roll(texture, 16 * i, axis=1)
        frame = av.VideoFrame.from_ndarray(image, format="yuv420p")
        frame.pts, frame.time_base = i * 3000, encoder.time_base
        packets += encoder.encode(frame)
    packets += encoder.encode(None)
    for packet in packets:
        packet.time_base = encoder.time_base
    return packets


def decode_all(units: list[bytes]) -> list[np.ndarray]:
    decoder = av.CodecContext.create("libdav1d", "r")
    decoder.options = {"max_frame_delay": "1"}
    pictures = []
    for unit in units:
        pictures += [f.to_ndarray() for f in decoder.decode(av.Packet(unit))]
    pictures += [f.to_ndarray() for f in decoder.decode(None)]
    return pictures


def test_a_4k_keyframe_and_inter_frames_round_trip_bit_exact() -> None:
    packets = encode_av1(3840, 2160, 3)
    assert [p.is_keyframe for p in packets] == [True, False, False]
    units = [bytes(p) for p in packets]
    assert len(units[0]) > 16384  # a three-byte obu_size at least
    back = []
    for unit in units:
        payloads = packetize_av1(unit)
        assert all(len(p) <= 1200 for p in payloads)
        back.append(depacketize_av1(payloads))
        assert av1_payload_starts_keyframe(payloads[0]) == (unit is units[0])
    assert back == units
    original, received = decode_all(units), decode_all(back)
    assert len(original) == 3 and original[0].shape == (2160 * 3 // 2, 3840)
    assert all(np.array_equal(a, b) for a, b in zip(original, received, strict=True))
