"""Per-frame timing records: keyed by the RTP timestamp on the wire, sent on the data channel;
their wire form, written by the worker and read by the measuring clients."""

from __future__ import annotations

import asyncio
import json

import pytest

from render_server.protocol.timing import TimingRecord, parse_timing
from render_server.stream.monitor import TIMING_INTERVAL_S
from render_server.tools.signaling_client import SignalingClient
from render_server.tools.viewer import Viewer
from render_server.transport.timing import FrameRecord, FrameTimingLog
from render_server.worker.local import LocalWorker

from .slow_stages import slowed
from .support import ServerFactory, ws_url
from .test_stream import metric

FRAMES, UNTIMED = "worker_frames_encoded_total", "worker_frames_untimed_total"


def record(pts: int, handed_ms: float = 0.0) -> FrameRecord:
    return FrameRecord(
        pts=pts, seq=-1, input_ms=None, start_ms=handed_ms - 5, rendered_ms=handed_ms - 3,
        encoded_ms=handed_ms - 1, handed_ms=handed_ms, bytes=100, keyframe=False,
    )  # fmt: skip


def test_the_first_marker_packet_reveals_aiortcs_timestamp_origin() -> None:
    log = FrameTimingLog()
    origin = 0xFFFF_F000  # near the wrap, as a random origin may be
    for i, pts in enumerate((0, 3000, 6000)):
        log.handed(record(pts, handed_ms=i * 33.0))
    log.packet_sent((origin + 0) & 0xFFFFFFFF, 1.0)
    log.packet_sent((origin + 3000) & 0xFFFFFFFF, 34.0)
    log.packet_sent((origin + 1234) & 0xFFFFFFFF, 35.0)  # no frame of ours: ignored
    log.packet_sent((origin + 6000) & 0xFFFFFFFF, 67.0)
    rows = [r.row() for r in log.drain()]
    assert [row[0] for row in rows] == [origin, (origin + 3000) & 0xFFFFFFFF, 0x770]
    assert [row[7] for row in rows] == [1.0, 34.0, 67.0]
    assert log.drain() == []


def test_a_frame_the_sender_never_sent_is_skipped_not_mismatched() -> None:
    log = FrameTimingLog()
    for pts in (0, 3000, 6000):
        log.handed(record(pts))
    log.packet_sent(500, 1.0)  # origin 500
    log.packet_sent(500 + 6000, 2.0)  # the frame at 3000 never went out
    assert [(r.rtp, r.sent_ms) for r in log.drain()] == [(500, 1.0), (6500, 2.0)]


def test_a_record_the_worker_writes_is_the_record_a_client_reads() -> None:
    log = FrameTimingLog()
    handed = FrameRecord(
        pts=3000, seq=12, input_ms=100.004, start_ms=101.5, rendered_ms=108.123,
        encoded_ms=111.0, handed_ms=111.2, bytes=1500, keyframe=True,
    )  # fmt: skip
    log.handed(handed)
    log.packet_sent(4000, 112.456)
    (sent,) = log.drain()
    row = sent.row()
    assert row == [4000, 12, 100.0, 101.5, 108.12, 111.0, 111.2, 112.46, 1500, 1]
    assert json.loads(json.dumps(row)) == row  # plain JSON
    assert TimingRecord.parse(row) == TimingRecord(
        4000, 12, 100.0, 101.5, 108.12, 111.0, 111.2, 112.46, 1500, True
    )
    quiet = FrameRecord(0, -1, None, 1.0, 2.0, 3.0, 4.0, 10, False).sent(7, 5.0)
    assert quiet.row()[1:3] == [-1, None] and quiet.row()[-1] == 0
    assert TimingRecord.parse(quiet.row()) == quiet


def test_timing_records_parse_and_refuse_malformed_rows() -> None:
    row = [4294967295, 7, 10.5, 11, 12.5, 14, 14.1, 15, 1200, 1]
    (record,) = parse_timing({"type": "timing", "frames": [row]})
    assert record == TimingRecord(4294967295, 7, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, True)
    none = TimingRecord.parse([5, -1, None, 1, 2, 3, 4, 5, 10, 0])
    assert none.input_ms is None and not none.keyframe
    for bad in (
        row[:9],
        [2**32, *row[1:]],
        [1, -2, *row[2:]],
        [1, 7, "x", *row[3:]],
        [*row[:3], float("nan"), *row[4:]],
        [*row[:8], -1, 1],
        [*row[:9], 2],
        "nope",
    ):
        with pytest.raises(ValueError):
            TimingRecord.parse(bad)
    with pytest.raises(ValueError):
        parse_timing({"type": "pong"})


@pytest.mark.parametrize(
    "row",
    [
        [7, 3, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 1],  # as the worker writes them
        [7, -1, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 0],  # an input beside seq -1: dropped
        [7, 3, None, 11, 12.5, 14, 14.1, 15, 1200, True],  # integral times, a bool key
        (7, 3, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 1),  # a tuple
        [7, 3, 1e308, 1e308, 1e308, 1e308, 1e308, 1e308, 0, 0],  # finite, their sum is not
    ],
)
def test_the_quick_way_and_the_general_way_read_a_row_alike(row: list[object]) -> None:
    assert TimingRecord.parse(row) == TimingRecord._parse_any(row)


@pytest.mark.parametrize(
    "bad",
    [
        [7, 3, 10.5, 11.0, 12.5, float("inf"), 14.1, 15.0, 1200, 1],
        [7, 3, float("nan"), 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 1],
        [7, 3, 10.5, 11.0, 12.5, 14.0, True, 15.0, 1200, 1],
        [7, True, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 1],
        [7, 3, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, 1200, 0.5],
        [7, 3, 10.5, 11.0, 12.5, 14.0, 14.1, 15.0, -1, 1],
    ],
)
def test_the_quick_way_refuses_what_the_general_way_does(bad: list[object]) -> None:
    with pytest.raises(ValueError):
        TimingRecord.parse(bad)


async def test_records_arrive_when_the_data_channel_leads_the_bundle(
    start_server: ServerFactory,
) -> None:
    # the data channel's mid first in the BUNDLE group (as a page that opens its channel
    # before its transceiver may offer): aiortc moves the video sender onto its transport
    server = await start_server()
    signaling = SignalingClient(ws_url(server))
    await signaling.start()
    pc = signaling.peer_connection()
    channel = pc.createDataChannel("input")
    pc.addTransceiver("video", direction="recvonly")
    timing: list[list[object]] = []
    channel.on(
        "message",
        lambda data: timing.extend(
            m["frames"] for m in [json.loads(data)] if m.get("type") == "timing"
        ),
    )
    try:
        await signaling.negotiate(pc, edit_offer=_data_channel_first)
        for _ in range(100):
            if len(timing) >= 2:
                break
            await asyncio.sleep(0.1)
        assert len(timing) >= 2, "no timing records"
        rows = [row for batch in timing for row in batch]  # type: ignore[attr-defined]
        assert all(isinstance(row[0], int) and row[7] is not None for row in rows)
    finally:
        await signaling.end()
        await pc.close()
        await signaling.close()


def _data_channel_first(sdp: str) -> str:
    lines = sdp.split("\r\n")
    group = next(i for i, line in enumerate(lines) if line.startswith("a=group:BUNDLE "))
    mids = lines[group].split()[1:]
    assert len(mids) == 2, mids
    lines[group] = "a=group:BUNDLE " + " ".join(reversed(mids))
    return "\r\n".join(lines)


@pytest.mark.parametrize("lag_frames", [0, 1])
async def test_an_encoder_that_hands_back_an_earlier_frame_gets_no_record(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, lag_frames: int
) -> None:
    """A record pairs a frame's RTP timestamp with the render times and input of the frame the
    encoder was just given. An encoder that lags (a lookahead) hands back an earlier frame: its
    record would show a later frame's times, a latency too short by the lag. No record is sent
    for such a frame; the frames still stream and /metrics counts them. Without the lag, every
    frame has its record (the same test, the encoder unwrapped but for the wrapper)."""
    monkeypatch.setattr(
        LocalWorker, "build_stages", slowed(LocalWorker.build_stages, lag_frames=lag_frames)
    )
    server = await start_server()
    async with Viewer(ws_url(server)) as viewer:
        for _ in range(10):
            await viewer.next_frame(timeout=20)
        await asyncio.sleep(2 * TIMING_INTERVAL_S)
        rows = [row for m in viewer.messages if m.get("type") == "timing" for row in m["frames"]]
        frames, untimed = await metric(server, FRAMES), await metric(server, UNTIMED)
    assert frames >= 10
    if lag_frames:
        assert rows == [] and untimed == frames, (len(rows), untimed, frames)
    else:
        assert len(rows) >= 10 and untimed == 0, (len(rows), untimed, frames)
