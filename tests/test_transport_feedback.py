"""Transport-wide congestion control feedback (RTCP RTPFB FMT=15): the wire format, byte for
byte as libwebrtc writes it."""

from __future__ import annotations

from struct import pack

import pytest
from aiortc.rtp import (
    RtcpPacket,
    RtcpPsfbPacket,
    RtcpReceiverInfo,
    RtcpRrPacket,
    RtcpRtpfbPacket,
    pack_remb_fci,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from render_server.transport.transport_feedback import (
    MAX_STATUS_COUNT,
    REFERENCE_WRAP_US,
    FeedbackBuilder,
    TransportFeedback,
    arrivals_of,
    split_transport_feedback,
    transport_feedback_packets,
)
from render_server.transport.transport_feedback_sequence import SequenceUnwrapper

# A packet Chromium sent, as captured and dissected by Wireshark (olivermichel/webrtc-analysis,
# test/include/data.h): base 1, 9 statuses, reference time 6197520, one run-length chunk of 9
# small deltas (7, 3, 11, 14, 0, 1, 0, 2, 6 ms), one byte of padding.
CHROMIUM = bytes.fromhex(
    "afcd0007 00000001 dd586eb6 00010009 5e911000 2009 1c0c2c38 00040008 18 01".replace(" ", "")
)
# pion/rtcp's transport_layer_cc_test.go "example4": base 4, 7 small deltas, 3 padding bytes
PION = bytes.fromhex(
    "afcd0007 fa17fa17 193dd8bb 00040007 10636e01 2007 4c242410 0c0c10 000003".replace(" ", "")
)


def body(packet: bytes) -> bytes:
    """The RTCP body after the common header, padding removed."""
    data = packet[4:]
    return data[: -data[-1]] if packet[0] & 0x20 else data


def chunks(packet: bytes) -> list[int]:
    """The status chunks of a serialized packet: read until they cover its status count."""
    left = int.from_bytes(packet[14:16], "big")
    words: list[int] = []
    pos = 20
    while left > 0:
        word = int.from_bytes(packet[pos : pos + 2], "big")
        words.append(word)
        pos += 2
        capacity = word & 0x1FFF if word < 0x8000 else 14 if word < 0xC000 else 7
        left -= min(capacity, left)
    return words


def ms(value: float) -> int:
    return round(value * 1000)


# -- known packets ---------------------------------------------------------------------------


def test_a_packet_chromium_sent_parses_and_is_written_back_byte_for_byte() -> None:
    [fb] = transport_feedback_packets(CHROMIUM)
    assert (fb.sender_ssrc, fb.media_ssrc, fb.base_sequence) == (1, 0xDD586EB6, 1)
    assert (fb.reference_time, fb.feedback_count) == (6197520, 0)
    reference = 6197520 * 64_000
    times = [t - reference for _, t in fb.packets if t is not None]
    assert [s for s, _ in fb.packets] == list(range(1, 10))
    steps = [b - a for a, b in zip([0, *times], times, strict=False)]
    assert steps == [ms(x) for x in (7, 3, 11, 14, 0, 1, 0, 2, 6)]
    assert bytes(fb) == fb.serialize() == CHROMIUM
    assert TransportFeedback.parse(body(CHROMIUM)) == fb
    # built from the same arrivals, libwebrtc's choices (reference, rounding) give the same bytes
    rebuilt = TransportFeedback.build(1, 0xDD586EB6, 0, fb.packets)
    assert rebuilt == fb and bytes(rebuilt) == CHROMIUM


def test_pions_example_round_trips_to_the_same_bytes() -> None:
    [fb] = transport_feedback_packets(PION)
    assert (fb.base_sequence, fb.reference_time, fb.feedback_count) == (4, 1074030, 1)
    assert len(fb.packets) == 7 and all(a is not None for _, a in fb.packets)
    assert bytes(fb) == PION


def test_libwebrtcs_one_bit_vector_case_in_exact_bytes() -> None:
    # transport_feedback_unittest.cc TransportFeedbackOneBitVector: received 1 2 7 8 9 10 13,
    # each at its number × 1 ms, SetBase(1, 1 ms)
    fb = TransportFeedback.build(
        0x11223344, 0x55667788, 9, [(s, s * 1000) for s in (1, 2, 7, 8, 9, 10, 13)]
    )
    assert bytes(fb) == bytes.fromhex(
        "afcd0007 11223344 55667788 0001000d 00000009"  # 13 statuses, reference 0, count 9
        "b0f2"  # one-bit vector: 1 1 0 0 0 0 1 1 1 1 0 0 1
        "04041404 04040c"  # deltas (× 250 µs) to arrivals at 1, 2, 7, 8, 9, 10, 13 ms
        "000003".replace(" ", "")  # padding, its length last
    )
    assert [a for _, a in fb.packets] == [
        1000, 2000, None, None, None, None, 7000, 8000, 9000, 10000, None, None, 13000,
    ]  # fmt: skip


def test_libwebrtcs_two_bit_vector_and_negative_delta_cases_in_exact_bytes() -> None:
    # TransportFeedbackTwoBitVector: received 1 2 6 7, each at its number × 64 ms
    fb = TransportFeedback.build(0, 0, 0, [(s, s * 64_000) for s in (1, 2, 6, 7)])
    assert bytes(fb) == bytes.fromhex(
        "afcd0007 00000000 00000000 00010007 00000100"  # reference 1 (64 ms)
        "d80a"  # two-bit vector: small large - - - large large
        "00 0100 0400 0100 000003".replace(" ", "")
    )
    # TransportFeedbackLargeAndNegativeDeltas: 1 2 6 7 8 at 2, 1, 4, 3, 3 + 64 ms
    times = [2000, 1000, 4000, 3000, 3000 + 64_000]
    fb = TransportFeedback.build(0, 0, 0, list(zip((1, 2, 6, 7, 8), times, strict=True)))
    packet = bytes(fb)
    assert packet == bytes.fromhex(
        "8fcd0007 00000000 00000000 00010008 00000000"  # 32 bytes: no padding, P clear
        "d806 4001"  # two-bit vector (small large - - - small large), then a run of 1 large
        "08 fffc 0c fffc 0100".replace(" ", "")  # 2 ms, -1 ms, +3 ms, -1 ms, +64 ms
    )
    assert [a for _, a in TransportFeedback.parse(body(packet)).packets] == [
        2000, 1000, None, None, None, 4000, 3000, 67_000,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("received", "times_us", "expected_chunks", "expected_size"),
    [
        # MaxRle: one-bit (1 received + 13 lost), a run of 8191 lost, the last received
        ((0, 8191 + 14), (1000, 2000), [0xA000, 0x1FFF, 0x2001], 20 + 6 + 2),
        # MinRle: one-bit (1 + 13 lost), a run of 15 lost, the last received
        ((0, 29), (1000, 2000), [0xA000, 0x000F, 0x2001], 20 + 6 + 2),
        # OneToTwoBitVector: a large delta among 7 statuses: one two-bit vector
        ((0, 6), (0, 64_250), [0xD002], 20 + 2 + 3),
        # OneToTwoBitVectorSimpleSplit: the 8th status is large: two-bit vector, then a run
        ((0, 7), (0, 64_250), [0xD000, 0x4001], 20 + 4 + 3),
    ],
)
def test_chunks_are_chosen_as_libwebrtc_chooses_them(
    received: tuple[int, int],
    times_us: tuple[int, int],
    expected_chunks: list[int],
    expected_size: int,
) -> None:
    fb = TransportFeedback.build(0, 0, 0, list(zip(received, times_us, strict=True)))
    packet = bytes(fb)
    assert chunks(packet) == expected_chunks
    assert len(packet) == (expected_size + 3) // 4 * 4  # as libwebrtc's test: whole words


def test_run_length_for_runs_vectors_for_mixtures() -> None:
    steady = TransportFeedback.build(0, 0, 0, [(s, s * 1000) for s in range(20)])
    assert chunks(bytes(steady)) == [0x2000 | 20]  # one run of 20 small deltas
    lost = TransportFeedback.build(0, 0, 0, [(0, 0), (100, 1000)])
    assert chunks(bytes(lost)) == [0xA000, 0x0000 | (99 - 13), 0x2001]  # 13 lost in the
    # one-bit vector after the first, the other 86 in a run
    # a small first delta, then 9 large: libwebrtc's greedy choice is not the shortest (a run
    # of one and a run of 9), but a two-bit vector of 7, then a run of the last 3
    large = TransportFeedback.build(0, 0, 0, [(s, s * 70_000) for s in range(10)])
    assert chunks(bytes(large)) == [0xC000 | 1 << 12 | 0xAAA, 0x4000 | 3]
    # eight small statuses then a large: the run ends, a two-bit vector follows
    split = [(s, s * 1000) for s in range(8)] + [(8, 8000 + 64_000)]
    split += [(s, 72_000 + s * 1000) for s in range(9, 22)]
    assert chunks(bytes(TransportFeedback.build(0, 0, 0, split))) == [
        0x2008,
        0xC000 | 2 << 12 | 1 << 10 | 1 << 8 | 1 << 6 | 1 << 4 | 1 << 2 | 1,
        0x2000 | 7,
    ]


# -- deltas, sequence numbers, limits -------------------------------------------------------


def test_deltas_round_to_250_us_from_the_previous_encoded_arrival() -> None:
    # libwebrtc's TransportFeedbackAliasing: 100 arrivals 83 µs apart never drift by more
    # than half a tick
    fb = TransportFeedback.build(0, 0, 0, [(s, s * 83) for s in range(100)])
    for seq, arrival in fb.packets:
        assert arrival is not None and abs(arrival - seq * 83) <= 125
    # half a tick rounds away from zero, both ways
    up = TransportFeedback.build(0, 0, 0, [(0, 64_000), (1, 64_125), (2, 64_000 - 4)])
    assert [a for _, a in up.packets] == [64_000, 64_250, 64_000]
    down = TransportFeedback.build(0, 0, 0, [(0, 64_000), (1, 64_000 - 125)])
    assert [a for _, a in down.packets] == [64_000, 64_000 - 250]


def test_large_and_negative_deltas_at_their_limits() -> None:
    most = 0x7FFF * 250
    fb = TransportFeedback.build(0, 0, 0, [(0, 0), (1, most), (2, 0)])
    assert [a for _, a in TransportFeedback.parse(body(bytes(fb))).packets] == [0, most, 0]
    with pytest.raises(ValueError, match="cannot add sequence number 1"):
        TransportFeedback.build(0, 0, 0, [(0, 0), (1, most + 250)])
    base = 1_000_000 * 64_000
    least = -0x8000 * 250
    fb = TransportFeedback.build(0, 0, 0, [(0, base), (1, base + least)])
    assert fb.packets[1][1] == base + least
    with pytest.raises(ValueError):
        TransportFeedback.build(0, 0, 0, [(0, base), (1, base + least - 250)])


def test_the_reference_time_is_24_bit_signed_and_wraps() -> None:
    late = (1 << 23) * 64_000 + 5_000  # past 2^23 ticks (6.2 days): negative on the wire
    fb = TransportFeedback.build(0, 0, 0, [(0, late), (1, late + 1000)])
    assert fb.reference_time == -(1 << 23)
    packet = bytes(fb)
    assert packet[16:19] == b"\x80\x00\x00"  # what libwebrtc writes too (2^23, unsigned)
    parsed = TransportFeedback.parse(body(packet))
    assert parsed == fb
    assert [a for _, a in parsed.packets] == [
        late - REFERENCE_WRAP_US,
        late + 1000 - REFERENCE_WRAP_US,
    ]
    # differences between arrivals survive, whatever the origin
    assert parsed.packets[1][1] - parsed.packets[0][1] == 1000  # type: ignore[operator]


def test_sequence_numbers_wrap_within_a_packet() -> None:
    top = 0xFFFF
    fb = TransportFeedback.build(
        0, 0, 0, [(s & top, i * 1000) for i, s in enumerate(range(top - 2, top + 4))]
    )
    assert fb.base_sequence == top - 2
    assert [s for s, _ in fb.packets] == [top - 2, top - 1, top, 0, 1, 2]
    assert TransportFeedback.parse(body(bytes(fb))) == fb
    # lost across the wrap (libwebrtc's OneBitVectorWrapMissing)
    fb = TransportFeedback.build(0, 0, 0, [(top - 2, 0), (top - 1, 1000), (1, 3000), (2, 4000)])
    assert fb.packets == (
        (top - 2, 0),
        (top - 1, 1000),
        (top, None),
        (0, None),
        (1, 3000),
        (2, 4000),
    )
    assert TransportFeedback.parse(body(bytes(fb))) == fb


def test_explicitly_lost_and_trailing_lost_packets() -> None:
    fb = TransportFeedback.build(0, 0, 0, [(5, None), (6, 1000), (9, None)])
    assert fb.packets == ((5, None), (6, 1000), (7, None), (8, None), (9, None))
    assert TransportFeedback.parse(body(bytes(fb))) == fb
    nothing = TransportFeedback.build(0, 0, 0, [(5, None)])
    assert nothing.packets == ((5, None),) and chunks(bytes(nothing)) == [0x0001]


def test_the_status_count_is_bounded_to_16_bits() -> None:
    # libwebrtc's TransportFeedbackLimits: 0, 0x8000, 0xFFFE fit (65535 statuses), 0xFFFF not
    most = [(0, 0), (0x8000, 1000), (0xFFFE, 2000)]
    fb = TransportFeedback.build(0, 0, 0, most)
    assert len(fb.packets) == MAX_STATUS_COUNT
    assert TransportFeedback.parse(body(bytes(fb))) == fb
    with pytest.raises(ValueError):
        TransportFeedback.build(0, 0, 0, [*most, (0xFFFF, 3000)])
    # a number more than half the space ahead is not newer: refused
    with pytest.raises(ValueError):
        TransportFeedback.build(0, 0, 0, [(0, 0), (0x8001, 1000)])
    with pytest.raises(ValueError):
        TransportFeedback.build(0, 0, 0, [(3, 0), (3, 1000)])  # not newer
    with pytest.raises(ValueError):
        TransportFeedback(0, 0, 0, 0, 0, tuple((s & 0xFFFF, None) for s in range(1 << 16)))
    with pytest.raises(ValueError):
        TransportFeedback.build(0, 0, 0, [])


def test_a_builder_refuses_what_does_not_fit_and_stays_as_it_was() -> None:
    builder = FeedbackBuilder(1, 2, 3, base_sequence=10, reference_us=0, max_size=40)
    assert builder.add_received(10, 0)
    assert not builder.add_received(9, 0)  # older
    assert not builder.add_received(11, 0x8000 * 250)  # delta beyond 16 bits
    n = 11
    while builder.add_received(n, n * 70_000):  # 2-byte deltas until 40 bytes are full
        n += 1
    assert builder.size <= 40 < builder.size + 2 * 2 and builder.status_count == n - 10
    before = builder.build()
    assert len(bytes(before)) == builder.size
    assert not builder.add_received(n + 100, n * 70_000)
    assert builder.build() == before
    roomier = FeedbackBuilder(1, 2, 3, base_sequence=10, reference_us=0, max_size=44)
    assert all(roomier.add_received(s, s * 70_000) for s in range(10, n + 1))


def test_invalid_fields_are_refused() -> None:
    good = TransportFeedback(1, 2, 3, 4, 5, ((3, None), (4, 4 * 64_000 + 250)))
    assert TransportFeedback.parse(body(bytes(good))) == good
    with pytest.raises(ValueError, match="sequence number"):
        TransportFeedback(1, 2, 3, 4, 5, ((3, None), (5, None)))
    with pytest.raises(ValueError, match="250"):
        TransportFeedback(1, 2, 3, 4, 5, ((3, 4 * 64_000 + 100),))
    with pytest.raises(ValueError, match="250"):
        TransportFeedback(1, 2, 3, 4, 5, ((3, 4 * 64_000 + 0x8000 * 250),))
    for bad in ({"sender_ssrc": 1 << 32}, {"base_sequence": -1}, {"reference_time": 1 << 23},
                {"feedback_count": 256}, {"media_ssrc": -1}):  # fmt: skip
        fields = {"sender_ssrc": 0, "media_ssrc": 0, "base_sequence": 0, "reference_time": 0,
                  "feedback_count": 0, "packets": ((0, None),)} | bad  # fmt: skip
        with pytest.raises(ValueError, match="out of range"):
            TransportFeedback(**fields)  # type: ignore[arg-type]


# -- malformed packets ----------------------------------------------------------------------


def header(status_count: int, base: int = 0) -> bytes:
    return pack("!IIHH", 1, 2, base, status_count) + b"\x00\x00\x01\x07"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "too short"),
        (header(1)[:17], "too short"),
        (header(0) + b"\x20\x01\x04", "no packet"),
        (header(20) + b"\x20\x0a\x04", "chunks end"),  # 10 of 20 statuses
        (header(3) + b"\x20\x03\x04\x04", "receive deltas"),  # 2 of 3 deltas
        (header(2) + b"\x40\x02\x00\x04", "receive deltas"),  # large: 2 bytes each
        (header(1) + b"\x60\x01\x00\x00\x00", "reserved"),  # run of the reserved symbol
        (header(7) + b"\xcd\x50" + bytes(8), "reserved"),  # the draft's two-bit example
        (header(0xFFFF) + b"\x1f\xff" * 8, "chunks end"),  # status count beyond the chunks
    ],
)
def test_malformed_packets_raise_value_error(data: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        TransportFeedback.parse(data)


def test_the_drafts_chunk_examples() -> None:
    # §3.1.3: a run of 221 packets not received
    fb = TransportFeedback.parse(header(221) + b"\x00\xdd")
    assert fb.packets == tuple((s, None) for s in range(221))
    # §3.1.4: a one-bit vector, not received / received (1-byte deltas follow)
    fb = TransportFeedback.parse(header(14) + b"\x9f\x1c" + bytes(8))
    assert [a is not None for _, a in fb.packets] == [bool(int(b)) for b in "01111100011100"]
    # a chunk's symbols beyond the status count are ignored; so are bytes after the deltas
    fb = TransportFeedback.parse(header(2) + b"\xd7\xff\x01\x02" + b"junk")
    assert [a for _, a in fb.packets] == [64_000 + 250, 64_000 + 750]  # reference 1


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_value_error(data: bytes) -> None:
    try:
        fb = TransportFeedback.parse(data)
    except ValueError:
        pass
    else:
        assert TransportFeedback.parse(body(bytes(fb))) == fb
    assert isinstance(transport_feedback_packets(data), list)
    framed = bytes([0xAF, 0xCD]) + ((len(data) + 3) // 4).to_bytes(2, "big") + data
    assert isinstance(transport_feedback_packets(framed + bytes(-len(data) % 4)), list)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_packets_never_raise_anything_but_value_error(data: st.DataObject) -> None:
    fb = data.draw(feedbacks())
    packet = bytearray(bytes(fb))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(4, len(packet) - 1))
        packet[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(4, len(packet)))
    for candidate in (bytes(packet[4:]), bytes(packet[4:cut])):
        try:
            TransportFeedback.parse(candidate)
        except ValueError:
            pass
    transport_feedback_packets(bytes(packet[:cut]))


# -- round trips ----------------------------------------------------------------------------


@st.composite
def arrival_lists(draw: st.DrawFn) -> list[tuple[int, int | None]]:
    seq = draw(st.integers(0, 0xFFFF))
    now = draw(st.integers(0, 1 << 40))
    arrivals: list[tuple[int, int | None]] = []
    for _ in range(draw(st.integers(1, 60))):
        if draw(st.booleans()) and arrivals:
            seq = (seq + draw(st.integers(1, 300))) & 0xFFFF  # a gap: lost in between
        elif arrivals:
            seq = (seq + 1) & 0xFFFF
        lost = draw(st.integers(0, 9)) == 0
        now += draw(st.one_of(st.integers(-2_000, 70_000), st.integers(-8_000_000, 8_000_000)))
        arrivals.append((seq, None if lost else now))
    return arrivals


@st.composite
def feedbacks(draw: st.DrawFn) -> TransportFeedback:
    arrivals = draw(arrival_lists())
    # keep every delta in range: from the previous *received* arrival, at most ±8 s
    last: int | None = None
    kept: list[tuple[int, int | None]] = []
    for seq, arrival in arrivals:
        if arrival is not None and last is not None and abs(arrival - last) > 8_000_000:
            arrival = last + (8_000_000 if arrival > last else -8_000_000)
        kept.append((seq, arrival))
        last = arrival if arrival is not None else last
    return TransportFeedback.build(
        draw(st.integers(0, 0xFFFFFFFF)), draw(st.integers(0, 0xFFFFFFFF)),
        draw(st.integers(0, 255)), kept,
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(feedbacks())
def test_any_built_packet_round_trips(fb: TransportFeedback) -> None:
    packet = bytes(fb)
    assert len(packet) % 4 == 0 and packet[1] == 205 and packet[0] & 0x1F == 15
    assert (len(packet) // 4 - 1) == int.from_bytes(packet[2:4], "big")
    if packet[0] & 0x20:  # padded: zeros, then how many
        assert 1 <= packet[-1] <= 3 and not any(packet[-packet[-1] : -1])
    assert transport_feedback_packets(packet) == [fb]
    assert TransportFeedback.parse(body(packet)) == fb
    assert TransportFeedback.parse(packet[4:]) == fb  # padding left on is ignored too


@settings(max_examples=300, deadline=None)
@given(arrival_lists())
def test_built_arrivals_are_the_inputs_within_half_a_tick(
    arrivals: list[tuple[int, int | None]],
) -> None:
    try:
        fb = TransportFeedback.build(0, 0, 0, arrivals)
    except ValueError:
        return  # a delta beyond ±8.19 s: libwebrtc would start another packet
    given_ = dict(arrivals)
    assert fb.base_sequence == arrivals[0][0]
    assert fb.packets[-1][0] == arrivals[-1][0]
    for seq, arrival in fb.packets:
        wanted = given_.get(seq)
        if wanted is None:
            assert arrival is None
        else:
            assert arrival is not None
            assert abs((arrival - wanted + REFERENCE_WRAP_US // 2) % REFERENCE_WRAP_US
                       - REFERENCE_WRAP_US // 2) <= 125  # fmt: skip


# -- compound datagrams ---------------------------------------------------------------------


def test_a_compound_datagram_with_a_report_remb_and_feedback() -> None:
    info = RtcpReceiverInfo(
        ssrc=9, fraction_lost=0, packets_lost=0, highest_sequence=5, jitter=1, lsr=0, dlsr=0
    )
    report = RtcpRrPacket(ssrc=7, reports=[info])
    remb = RtcpPsfbPacket(fmt=15, ssrc=7, media_ssrc=0, fci=pack_remb_fci(1_000_000, [9]))
    padded = TransportFeedback.build(7, 9, 0, [(100, 1000), (101, 2000), (103, 9000)])
    unpadded = TransportFeedback.build(7, 9, 1, [(104, 10_000), (105, 11_000)])
    assert bytes(padded)[0] & 0x20 and not bytes(unpadded)[0] & 0x20
    nack = RtcpRtpfbPacket(fmt=1, ssrc=7, media_ssrc=9, lost=[3, 4])
    datagram = bytes(report) + bytes(remb) + bytes(padded) + bytes(nack) + bytes(unpadded)
    assert transport_feedback_packets(datagram) == [padded, unpadded]
    assert arrivals_of(transport_feedback_packets(datagram)) == {
        100: 1000, 101: 2000, 102: None, 103: 9000, 104: 10_000, 105: 11_000,
    }  # fmt: skip
    # what aiortc makes of it: the padded one fails its NACK parser and takes the whole
    # datagram with it; an unpadded one reads as a NACK packet of FMT 15 (its sender ignores it)
    with pytest.raises(ValueError):
        RtcpPacket.parse(datagram)
    parsed = RtcpPacket.parse(bytes(report) + bytes(unpadded))
    assert isinstance(parsed[1], RtcpRtpfbPacket) and parsed[1].fmt == 15
    # what the send path hands aiortc instead: the datagram without its feedback, whole
    found, rest = split_transport_feedback(datagram)
    assert found == [padded, unpadded]
    assert rest == bytes(report) + bytes(remb) + bytes(nack)
    kept = RtcpPacket.parse(rest)
    assert [type(p) for p in kept] == [RtcpRrPacket, RtcpPsfbPacket, RtcpRtpfbPacket]
    assert kept[2].lost == [3, 4]
    assert split_transport_feedback(bytes(report) + b"\x80") == ([], bytes(report) + b"\x80")


def test_a_broken_packet_is_skipped_and_a_broken_datagram_ends_the_scan() -> None:
    good = bytes(TransportFeedback.build(1, 2, 0, [(0, 0), (1, 1000)]))
    broken = bytes([0x8F, 205, 0, 4]) + header(5)  # 5 statuses, no chunk
    bad_padding = bytes([0xAF, 205, 0, 5]) + header(1) + b"\x20\x01\x04\x00"  # padding 0
    assert transport_feedback_packets(broken + bad_padding + good) == [
        TransportFeedback.parse(good[4:])
    ]
    assert transport_feedback_packets(good + b"\x00" * 8) == transport_feedback_packets(good)
    assert transport_feedback_packets(good + good[:-4]) == transport_feedback_packets(good)
    assert transport_feedback_packets(b"\xaf") == []


def test_arrivals_of_keeps_a_late_received_over_lost() -> None:
    first = TransportFeedback.build(0, 0, 0, [(1, 1000), (3, 3000)])
    second = TransportFeedback.build(0, 0, 1, [(2, 2500), (3, 3000)])
    assert arrivals_of([first, second]) == {1: 1000, 2: 2500, 3: 3000}
    assert arrivals_of([second, first]) == {1: 1000, 2: 2500, 3: 3000}


# -- sequence unwrapping --------------------------------------------------------------------


def test_the_unwrapper_follows_libwebrtcs_cases() -> None:
    # rtc_base/numerics/sequence_number_unwrapper_unittest.cc: Unwrap and PeekUnwrap
    top, dist = 0xFFFF, 0x8000
    unwrapper = SequenceUnwrapper()
    for seq, want in [(0, 0), (dist, dist), (0, 0), (dist, dist), (top, top), (0, top + 1),
                      (top, top), (dist, dist), (0, 0)]:  # fmt: skip
        assert unwrapper.unwrap(seq) == want
    unwrapper = SequenceUnwrapper()
    assert unwrapper.peek(10) == 10 and unwrapper.peek(dist + 10) == dist + 10
    assert unwrapper.unwrap(10) == 10 and unwrapper.peek(12) == 12
    assert unwrapper.unwrap(dist + 12) == -dist + 12
    unwrapper = SequenceUnwrapper()
    step = top // 2
    assert unwrapper.unwrap(step) == step and unwrapper.unwrap(2 * step) == 2 * step
    assert unwrapper.peek(0) == top + 1 and unwrapper.peek(top - 3) == top - 3
    with pytest.raises(ValueError):
        unwrapper.unwrap(1 << 16)


@settings(deadline=None)
@given(st.lists(st.integers(-300, 3000), min_size=1, max_size=200), st.integers(0, 0xFFFF))
def test_unwrapping_recovers_a_sequence_with_mild_reordering(steps: list[int], start: int) -> None:
    unwrapper = SequenceUnwrapper()
    value = start
    assert unwrapper.unwrap(value & 0xFFFF) == value
    for step in steps:
        value += step
        assert unwrapper.unwrap(value & 0xFFFF) == value
