"""Measurement: frame assembly, decoding, clock alignment and breakdowns on their own, then the
measuring client against a real server."""

from __future__ import annotations

import fractions
import json
import random
import statistics
from collections.abc import Iterator

import av
import numpy as np
import pytest
from aiortc.codecs.h264 import H264Encoder

from render_server.encode.x264 import x264_options
from render_server.protocol.timing import TimingRecord
from render_server.tools.measure.client import LatencyClient
from render_server.tools.measure.clock import ClockOffset
from render_server.tools.measure.frames import (
    FrameAssembler,
    FrameDecoder,
    ObservedFrame,
    h264_keyframe_nal,
)
from render_server.tools.measure.latency import (
    FRAME_STAGES,
    INPUT_STAGES,
    LatencyMatcher,
    frame_breakdown,
    input_breakdown,
)
from render_server.tools.measure.matching import FrameMatcher
from render_server.tools.stats import percentile, percentiles

from .browser import serve_process
from .support import observed_frame, timing_record

P_SLICE = bytes([0x41]) + b"p" * 40
IDR_SLICE = bytes([0x65]) + b"i" * 40
SPS, PPS = bytes([0x67, 0x42, 0xE0, 0x1F]), bytes([0x68, 0xCE, 0x3C, 0x80])


def stap_a(*nals: bytes) -> bytes:
    return bytes([0x78]) + b"".join(len(n).to_bytes(2, "big") + n for n in nals)


def fu_a(nal: bytes, parts: int) -> list[bytes]:
    """`nal` split into `parts` FU-A fragments."""
    body, step = nal[1:], -(-len(nal[1:]) // parts)
    chunks = [body[i : i + step] for i in range(0, len(body), step)]
    out = []
    for i, chunk in enumerate(chunks):
        header = (0x80 if i == 0 else 0) | (0x40 if i == len(chunks) - 1 else 0) | (nal[0] & 0x1F)
        out.append(bytes([(nal[0] & 0xE0) | 28, header]) + chunk)
    return out


class Collect:
    def __init__(self) -> None:
        self.frames: list[ObservedFrame] = []

    def __call__(self, frame: ObservedFrame, access_unit: bytes) -> None:
        self.frames.append(frame)


def packets_of(frames: list[list[bytes]], first_seq: int = 100, ts0: int = 5000) -> list[tuple]:
    """(seq, timestamp, marker, payload) for frames given as lists of payloads."""
    out, seq = [], first_seq
    for i, payloads in enumerate(frames):
        for j, payload in enumerate(payloads):
            ts = (ts0 + 3000 * i) & 0xFFFFFFFF
            out.append((seq & 0xFFFF, ts, j == len(payloads) - 1, payload))
            seq += 1
    return out


def feed(assembler: FrameAssembler, packets: list[tuple]) -> None:
    for arrival, (seq, ts, marker, payload) in enumerate(packets):
        assembler.add(seq, ts, marker, payload, float(arrival))


# -- keyframes ----------------------------------------------------------------------------------


def test_keyframes_are_told_by_idr_or_sps_in_any_packetization() -> None:
    assert h264_keyframe_nal(IDR_SLICE)
    assert h264_keyframe_nal(SPS)
    assert not h264_keyframe_nal(P_SLICE)
    assert h264_keyframe_nal(stap_a(SPS, PPS))
    assert not h264_keyframe_nal(stap_a(PPS, bytes([0x06, 0x05])))  # PPS and SEI only
    first, *rest = fu_a(IDR_SLICE, 3)
    assert h264_keyframe_nal(first) and not any(h264_keyframe_nal(p) for p in rest)
    assert not any(h264_keyframe_nal(p) for p in fu_a(P_SLICE, 3))
    assert not h264_keyframe_nal(b"")


# -- assembly -----------------------------------------------------------------------------------


def test_frames_close_on_the_marker_in_order() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    frames = [[stap_a(SPS, PPS), *fu_a(IDR_SLICE, 3)], [P_SLICE], fu_a(P_SLICE, 2)]
    packets = packets_of(frames)
    feed(assembler, packets)
    assert [(f.packets, f.keyframe, f.complete, f.lost) for f in got.frames] == [
        (4, True, True, 0),
        (1, False, True, 0),
        (2, False, True, 0),
    ]
    # each closes at its own marker packet, not when the next frame starts
    assert [f.last_ms for f in got.frames] == [3.0, 4.0, 6.0]
    assert [f.first_ms for f in got.frames] == [0.0, 4.0, 5.0]
    assert [f.rtp for f in got.frames] == [5000, 8000, 11000]
    assert got.frames[0].size == sum(len(p) for p in frames[0])
    assert assembler.stats.frames == 3 and assembler.stats.incomplete == 0


def test_reordered_packets_complete_the_frame_when_the_last_one_arrives() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    packets = packets_of([fu_a(IDR_SLICE, 3), fu_a(P_SLICE, 3)])
    order = [0, 2, 1, 4, 5, 3]  # marker before a middle packet; next frame's first last
    for arrival, i in enumerate(order):
        seq, ts, marker, payload = packets[i]
        assembler.add(seq, ts, marker, payload, float(arrival))
    assert [(f.complete, f.packets, f.last_ms) for f in got.frames] == [
        (True, 3, 2.0),
        (True, 3, 5.0),
    ]


def test_sequence_numbers_wrap() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    feed(assembler, packets_of([fu_a(IDR_SLICE, 3), fu_a(P_SLICE, 3)], first_seq=65534))
    assert [(f.complete, f.packets) for f in got.frames] == [(True, 3), (True, 3)]


def test_a_lost_packet_leaves_its_frame_incomplete_and_counted() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    frames = [[P_SLICE]] + [fu_a(P_SLICE, 3)] + [[P_SLICE]] * 12
    packets = packets_of(frames)
    del packets[2]  # the middle fragment of the second frame
    feed(assembler, packets)
    assembler.flush()
    by_rtp = {f.rtp: f for f in got.frames}
    assert len(by_rtp) == 14
    lossy = by_rtp[8000]
    assert not lossy.complete and lossy.lost == 1 and lossy.packets == 2
    assert all(f.complete for rtp, f in by_rtp.items() if rtp != 8000)
    assert assembler.stats.lost_packets == 1 and assembler.stats.incomplete == 1


def test_a_lost_marker_ends_the_frame_where_the_next_begins() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    packets = packets_of([[P_SLICE]] + [fu_a(P_SLICE, 3)] + [[P_SLICE]] * 12)
    del packets[3]  # the marker of the second frame
    feed(assembler, packets)
    by_rtp = {f.rtp: f for f in got.frames}
    assert not by_rtp[8000].complete and by_rtp[8000].lost == 1
    assert by_rtp[11000].complete  # the next frame does not inherit the gap


def test_a_lost_first_packet_is_counted_against_its_frame() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    packets = packets_of([[P_SLICE]] + [fu_a(P_SLICE, 3)] + [[P_SLICE]] * 12)
    del packets[1]
    feed(assembler, packets)
    by_rtp = {f.rtp: f for f in got.frames}
    assert not by_rtp[8000].complete and by_rtp[8000].lost == 1


def test_a_retransmitted_packet_completes_a_waiting_frame_and_duplicates_are_ignored() -> None:
    got = Collect()
    assembler = FrameAssembler(got)
    packets = packets_of([fu_a(IDR_SLICE, 3), [P_SLICE], [P_SLICE]])
    missing = packets.pop(1)
    feed(assembler, packets)
    assert [f.rtp for f in got.frames] == [8000, 11000]  # the first waits for its packet
    assembler.add(missing[0], missing[1], missing[2], missing[3], 10.0)
    assembler.add(missing[0], missing[1], missing[2], missing[3], 11.0)  # a second copy
    assert got.frames[-1].rtp == 5000 and got.frames[-1].complete
    assert got.frames[-1].last_ms == 10.0
    assert assembler.stats.late == 1


# -- decoding -----------------------------------------------------------------------------------


def encoded_stream(count: int, width: int = 160, height: int = 96) -> list[av.Packet]:
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
    encoder.time_base = fractions.Fraction(1, 30)
    encoder.bit_rate = 300_000
    encoder.options = x264_options(1)
    ramp = np.tile(np.arange(width, dtype=np.uint8)[None, :, None], (height, 1, 3))
    out = []
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(np.roll(ramp, 3 * i, axis=1), format="rgb24")
        frame = frame.reformat(format="yuv420p")
        frame.pts = i
        for packet in encoder.encode(frame):
            packet.time_base = encoder.time_base
            out.append(packet)
    return out


@pytest.mark.parametrize("mode", ["keyframes", "all"])
def test_decoder_decodes_frames_assembled_from_aiortc_packetization(mode: str) -> None:
    decoder = FrameDecoder(mode)  # type: ignore[arg-type]
    got = Collect()

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        got(frame, access_unit)
        decoder.offer(frame, access_unit)

    assembler = FrameAssembler(on_frame, keep_payload=True)
    packetizer = H264Encoder()
    seq = random.randrange(1 << 16)
    for packet in encoded_stream(12):
        payloads, timestamp = packetizer.pack(packet)
        for i, payload in enumerate(payloads):
            assembler.add(seq & 0xFFFF, timestamp, i == len(payloads) - 1, payload, 0.0)
            seq += 1
    decoder.close()
    assert len(got.frames) == 12 and all(f.complete for f in got.frames)
    assert [f.keyframe for f in got.frames] == [True] + [False] * 11
    expected = 1 if mode == "keyframes" else 12
    assert decoder.stats.errors == 0
    assert decoder.stats.sizes == {(160, 96): expected}


def test_decoder_waits_for_a_keyframe_after_a_lost_frame() -> None:
    decoder = FrameDecoder("all")
    key = ObservedFrame(1, 0, 0, 10, 1, 0, True, True, 0)
    delta = ObservedFrame(2, 0, 0, 10, 1, 0, False, True, 1)
    lost = ObservedFrame(3, 0, 0, 10, 1, 1, False, False, 2)
    decoder.offer(delta, b"x")  # nothing before a keyframe
    decoder.offer(key, b"\x00\x00\x00\x01\x65")
    decoder.offer(delta, b"\x00\x00\x00\x01\x41")
    decoder.offer(lost, b"")
    decoder.offer(delta, b"\x00\x00\x00\x01\x41")  # its references are gone
    decoder.close()
    assert decoder.stats.offered == 2


# -- clock, matching and breakdowns ----------------------------------------------------------------


def test_clock_offset_is_the_middle_of_the_intersection_of_the_round_trips_bounds() -> None:
    clock = ClockOffset(window=3)
    clock.add(0.0, 1001.0, 30.0)  # worker − client within [971, 1001]: a quick ping leg
    assert clock.offset == 986.0 and clock.error_bound == 15.0  # one sample: half its rtt
    clock.add(100.0, 1127.0, 128.0)  # within [999, 1027]: a quick pong leg
    assert clock.offset == 1000.0 and clock.error_bound == 1.0
    assert clock.best.rtt == 28.0  # the fastest round trip alone would say 1013
    assert clock.to_worker(10.0) == 1010.0
    for t in (300.0, 400.0, 500.0):  # both bounding samples leave the window
        clock.add(t, t + 1005.0, t + 10)  # within [995, 1005]
    assert clock.offset == 1000.0 and clock.error_bound == 5.0
    assert clock.summary() == {
        "offset_ms": 1000.0, "error_bound_ms": 5.0, "rtt_ms": 10.0, "samples": 3,
        "intervals_met": True,
    }  # fmt: skip
    with pytest.raises(ValueError):
        clock.add(10.0, 0.0, 5.0)
    with pytest.raises(LookupError):
        ClockOffset().to_worker(0.0)


def test_clock_offset_falls_back_to_the_fastest_round_trip_where_the_bounds_do_not_meet() -> None:
    clock = ClockOffset(window=4)
    clock.add(0.0, 1010.0, 30.0)  # [980, 1010]
    clock.add(100.0, 1105.0, 104.0)  # [1001, 1005]
    clock.add(200.0, 1722.0, 226.0)  # the worker's clock stepped by 500: [1496, 1522]
    assert clock.offset == 1003.0 and clock.error_bound == 2.0  # the 4 ms round trip's middle
    assert clock.summary()["intervals_met"] is False


def test_clock_offset_stays_within_its_bound_where_either_side_holds_a_leg() -> None:
    """Round trips on one host whose legs wait in a busy event loop, the worker's for the ping
    and the client's for the pong, each for its own random time: the truth is always inside the
    bound given, and the estimate is far nearer than half the fastest round trip."""
    rng = random.Random(18)
    truth = 1000.0
    ours, fastest = [], []
    for _ in range(200):
        clock = ClockOffset()
        t = 0.0
        for _ in range(20):
            t += 1000.0
            ping_leg = 0.1 + rng.expovariate(1 / 4.0)  # waits for the worker's loop
            pong_leg = 0.1 + rng.expovariate(1 / 2.0)  # waits for the client's
            clock.add(t, t + ping_leg + truth, t + ping_leg + pong_leg)
        assert abs(clock.offset - truth) <= clock.error_bound + 1e-9
        assert clock.error_bound <= clock.best.rtt / 2
        ours.append(abs(clock.offset - truth))
        fastest.append(abs(clock.best.offset - truth))
    assert statistics.mean(ours) < statistics.mean(fastest) / 2


def test_breakdown_stages_add_up_to_the_totals() -> None:
    rng = random.Random(7)
    for _ in range(200):
        t = sorted(rng.uniform(0, 1000) for _ in range(8))
        sent, arrived_input, r0, r1, e1, h, s, arrived = t
        record = TimingRecord(1, 3, arrived_input, r0, r1, e1, h, s, 100, False)
        frame = frame_breakdown(record, arrived)
        assert sum(getattr(frame, k) for k in FRAME_STAGES) == pytest.approx(frame.total)
        assert frame.total == pytest.approx(arrived - r0)
        taken = input_breakdown(2, sent, record, arrived)
        assert sum(getattr(taken, k) for k in INPUT_STAGES) == pytest.approx(taken.total)
        assert taken.total == pytest.approx(arrived - sent)
    with pytest.raises(ValueError):
        input_breakdown(4, 0.0, TimingRecord(1, 3, 1.0, 2, 3, 4, 5, 6, 1, False), 9.0)


def test_matcher_pairs_records_with_frames_and_inputs_with_the_first_frame_showing_them() -> None:
    matcher = LatencyMatcher()
    matcher.clock.add(0.0, 500.0, 2.0)  # worker = client + 499
    # inputs 1..3 sent at client 10, 20, 30 (worker 509, 519, 529)
    for seq, t in ((1, 10.0), (2, 20.0), (3, 30.0)):
        matcher.input_sent(seq, t)
    rows = [
        [100, 1, 512.0, 515, 520, 523, 523.5, 524, 900, 1],
        [200, -1, None, 548, 550, 552, 552.5, 553, 300, 0],
        [300, 3, 532.0, 581, 583, 585, 585.5, 586, 300, 0],  # took inputs 2 and 3 at once
        [400, -1, None, 615, 617, 619, 619.5, 620, 300, 0],  # never arrives
    ]
    matcher.add_timing({"type": "timing", "frames": rows})
    for rtp, last in ((100, 27.0), (200, 56.0), (300, 89.0), (999, 95.0)):  # client clock
        matcher.add_frame(ObservedFrame(rtp, last - 1, last, 500, 2, 0, rtp == 100, True))
    report = matcher.report()
    assert report["frames"] == 3 and report["unmatched_records"] == 1
    assert report["unmatched_frames"] == 1 and report["inputs_answered"] == 3
    inputs = {b.seq: b for b in matcher.input_breakdowns()}
    assert inputs[1].total == pytest.approx(27 + 499 - 509)
    assert inputs[2].total == pytest.approx(89 + 499 - 519)  # reflected first by frame 300
    assert inputs[2].input == pytest.approx(532 - 519) and inputs[2].wait == pytest.approx(49)
    frames = {b.rtp: b for b in matcher.frame_breakdowns()}
    assert frames[200].total == pytest.approx(56 + 499 - 548)
    assert frames[200].network == pytest.approx(56 + 499 - 553)
    assert report["glass_to_glass"]["count"] == 3
    assert set(report["stages"]) == set(INPUT_STAGES)
    assert report["clock"] == {
        "offset_ms": 499.0, "error_bound_ms": 1.0, "rtt_ms": 2.0, "samples": 1,
        "intervals_met": True,
    }  # fmt: skip
    matcher.add_timing({"type": "timing", "frames": [[1, 2]]})
    assert matcher.report()["bad_records"] == 1


class Pairs(FrameMatcher):
    def __init__(self, limit: int | None = None) -> None:
        super().__init__(limit=limit)
        self.pairs: list[tuple[int, int, bool]] = []

    def matched(self, record: TimingRecord, frame: ObservedFrame) -> None:
        self.pairs.append((record.rtp, frame.rtp, frame.complete))


def test_the_matcher_pairs_a_record_with_its_frame_whichever_comes_first() -> None:
    matcher = Pairs()
    matcher.add_record(timing_record(100))  # the record first: the frame was slow
    assert matcher.pairs == [] and list(matcher.waiting_records) == [100]
    matcher.add_frame(observed_frame(200))  # the frame first: its record is still batched
    matcher.add_frame(observed_frame(100))
    matcher.add_frame(observed_frame(300, complete=False))  # paired all the same: the user decides
    matcher.add_record(timing_record(300))
    matcher.add_record(timing_record(200))
    assert matcher.pairs == [(100, 100, True), (300, 300, False), (200, 200, True)]
    assert matcher.waiting_records == {} and matcher.waiting_frames == {}
    assert matcher.record_count == 3


def test_the_matcher_keeps_at_most_limit_halves_waiting_the_oldest_given_up() -> None:
    matcher = Pairs(limit=4)
    for rtp in range(10):
        matcher.add_record(timing_record(1000 + rtp))  # frames that never come
        matcher.add_frame(observed_frame(2000 + rtp))  # records that never come
    assert list(matcher.waiting_records) == [1006, 1007, 1008, 1009]
    assert list(matcher.waiting_frames) == [2006, 2007, 2008, 2009]
    matcher.add_frame(observed_frame(1000))  # its record was given up: this frame now waits
    matcher.add_record(timing_record(2009))
    assert matcher.pairs == [(2009, 2009, True)]
    assert list(matcher.waiting_frames) == [2007, 2008, 1000]


def test_the_matcher_takes_timing_and_pongs_and_passes_on_the_rest() -> None:
    matcher = Pairs()
    ping = matcher.clock.ping(0.0)
    pong = {"type": "pong", "id": ping["id"], "t": 0.0, "w": 1000.0}
    assert matcher.receive(json.dumps(pong)) is None
    assert len(matcher.clock.samples) == 1
    rows = [timing_record(7).row()]
    assert matcher.receive(json.dumps({"type": "timing", "frames": rows})) is None
    assert list(matcher.waiting_records) == [7]
    assert matcher.receive(json.dumps({"type": "timing", "frames": [[1, 2]]})) is None
    assert matcher.bad_timing == 1 and matcher.record_count == 1
    assert matcher.receive('{"type": "quality", "fps": 30}') == {"type": "quality", "fps": 30}
    assert matcher.receive("[1, 2]") is None and matcher.receive("nope") is None


def test_percentiles() -> None:
    assert percentiles([]) is None
    summary = percentiles(float(v) for v in range(101))
    assert summary == {"p50": 50.0, "p95": 95.0, "p99": 99.0, "mean": 50.0, "count": 101}
    assert percentiles([3.0])["p99"] == 3.0  # type: ignore[index]
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # the median of an even count


# -- end to end, against a real `render-server serve` --------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("measure") / "serve.log"
    with serve_process("--resolution", "320x240", "--fps", "20", log_path=log) as url:
        yield url


async def test_every_record_meets_its_frame_and_the_stages_add_up(server: str) -> None:
    async with LatencyClient(server, decode="all", input_rate=10.0) as client:
        report = await client.measure(3.0)
        frames = client.matcher.frame_breakdowns()
        inputs = client.matcher.input_breakdowns()
        observed = dict(client.matcher.frames)
    assert report["worker_errors"] == []
    assert report["records"] >= 20 and report["bad_records"] == 0
    # loopback loses nothing: every frame with a record arrived, every frame got its record
    assert report["unmatched_records"] == 0 and report["incomplete_frames"] == 0
    assert report["unmatched_frames"] <= 3  # the last few, whose records were still on the way
    assert report["frames"] == report["records"] and report["keyframes"] >= 1
    assert report["inputs_answered"] >= report["inputs"] - 3
    decode = report["decode"]
    assert decode["errors"] == 0 and decode["sizes"] == {"320x240": decode["decoded"]}
    assert decode["decoded"] >= report["frames"] - 3
    for b in frames:
        assert abs(sum(getattr(b, s) for s in FRAME_STAGES) - b.total) < 1.0, b
        assert b.render >= 0 and b.encode >= 0 and b.send >= 0
    for b in inputs:
        assert abs(sum(getattr(b, s) for s in INPUT_STAGES) - b.total) < 1.0, b
    assert all(f.complete and f.packets >= 1 for f in observed.values())
    assert report["clock"]["samples"] >= 5
    for name in ("glass_to_glass", "input_to_frame", *(f"stages.{s}" for s in INPUT_STAGES)):
        summary = report["stages"][name[7:]] if name.startswith("stages.") else report[name]
        assert summary["p50"] <= summary["p95"] <= summary["p99"], name


@pytest.mark.parametrize("codec", ["VP8", "AV1"])
async def test_the_client_measures_the_codec_it_asked_for(server: str, codec: str) -> None:
    async with LatencyClient(server, decode="all", input_rate=10.0, codec=codec) as client:
        report = await client.measure(1.5)
    assert report["codec"] == codec and report["worker_errors"] == []
    assert report["keyframes"] >= 1 and report["incomplete_frames"] == 0
    assert report["unmatched_records"] == 0
    decode = report["decode"]
    assert decode["errors"] == 0 and decode["sizes"] == {"320x240": decode["decoded"]}
    assert decode["decoded"] >= report["frames"] - 3
