"""The load test's verdict never passes what did not hold: a stream that never started fails,
a stream under 95 % of the asked rate fails without --min-fps, rates are over the time a stream
streamed, the hold begins when every stream is up. Pure tests of the report on made-up results,
and one real run where a stream waits in the queue the whole time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from render_server.config import Resolution
from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.drag import MAX_PITCH_DRIFT, drag_events
from render_server.tools.loadtest.report import build_report
from render_server.tools.loadtest.result import StreamResult
from render_server.tools.loadtest.runner import RunResult

from .browser import serve_process

RAMP_S, HOLD_S = 2.0, 20.0
END_S = RAMP_S + HOLD_S


def _config(**changes: object) -> LoadTestConfig:
    fields: dict[str, object] = dict(
        server="http://127.0.0.1:1", streams=2, resolution=Resolution(320, 240), fps=30.0,
        duration_s=HOLD_S, ramp_s=RAMP_S,
    )  # fmt: skip
    fields.update(changes)
    return LoadTestConfig(**fields)  # type: ignore[arg-type]


def _stream(
    index: int,
    first_s: float | None,
    last_s: float = END_S,
    fps: float = 30.0,
    state: str = "closed",
) -> StreamResult:
    """A stream that had frames at `fps` from `first_s` to `last_s`, 1000 bytes each."""
    r = StreamResult(index, 0, state=state, requested_s=RAMP_S * index / 2)
    if first_s is not None:
        r.first_frame_s = first_s
        count = int((last_s - first_s) * fps) + 1
        r.frame_t_s = [first_s + i / fps for i in range(count)]
        r.frames, r.bytes = count, 1000 * count
        r.frames_per_s = [0] * int(END_S + 1)
        for t in r.frame_t_s:
            r.frames_per_s[int(t)] += 1
    r.ended_s = END_S + 0.5
    return r


def _report(config: LoadTestConfig, streams: list[StreamResult]) -> dict[str, object]:
    run = RunResult(config, {"description": "made up"}, streams, 0.0, END_S + 1, {}, None, "none")
    return build_report(run)


def test_a_stream_that_never_started_fails_the_run() -> None:
    # as the old harness left a stream queued the whole run: "closed", no frame, no reason
    report = _report(_config(), [_stream(0, 0.1), _stream(1, None)])
    queued = report["streams"][1]  # type: ignore[index]
    assert queued["state"] == "failed" and queued["never_started"] and queued["mbps"] is None
    assert queued["decode_ok"] is None  # no verdict on video it never had
    aggregate = report["aggregate"]
    assert aggregate["failed"] == 1 and aggregate["up_to_the_end"] == 1  # type: ignore[index]
    verdict = report["verdict"]
    assert not verdict["passed"]  # type: ignore[index]
    assert "1 stream(s) never started (#1)" in verdict["line"]  # type: ignore[index]


def test_datagrams_the_harness_itself_dropped_fail_the_run() -> None:
    """Every frame on time, yet the harness's own socket overflowed: the run cannot vouch for
    what the server sent, and says why."""
    clean, behind = _stream(0, 0.1), _stream(1, 0.1)
    behind.socket_dropped = 12
    assert _report(_config(), [clean, _stream(1, 0.1)])["verdict"]["passed"]  # type: ignore[index]
    report = _report(_config(), [clean, behind])
    assert report["streams"][1]["socket_dropped"] == 12  # type: ignore[index]
    verdict = report["verdict"]
    assert not verdict["passed"]  # type: ignore[index]
    line = verdict["line"]  # type: ignore[index]
    assert "1 stream(s) lost datagrams in the harness's own full socket buffers" in line
    assert "(#1)" in line


def test_a_first_frame_after_the_end_is_no_start() -> None:
    late = _stream(1, END_S + 0.2, last_s=END_S + 0.3)  # a slot freed as the others closed
    report = _report(_config(), [_stream(0, 0.1), late])
    assert report["streams"][1]["never_started"]  # type: ignore[index]
    assert not report["verdict"]["passed"]  # type: ignore[index]


@pytest.mark.parametrize(("fps", "passed"), [(15.0, False), (28.0, False), (29.0, True)])
def test_without_min_fps_a_stream_under_95_percent_of_the_target_fails(
    fps: float, passed: bool
) -> None:
    report = _report(_config(), [_stream(0, 0.1), _stream(1, 1.0, fps=fps)])
    assert report["aggregate"]["fps_floor"] == 28.5  # type: ignore[index]
    verdict = report["verdict"]
    assert verdict["passed"] is passed, verdict  # type: ignore[index]
    if not passed:
        assert "1 stream(s) below 28.5 fps over the hold (#1)" in verdict["line"]  # type: ignore[index]
    # an explicit --min-fps still rules
    assert _report(_config(min_fps=10.0), [_stream(0, 0.1), _stream(1, 1.0, fps=fps)])["verdict"][
        "passed"
    ]  # type: ignore[index]


@pytest.mark.parametrize(("bound_ms", "passed"), [(0.5, True), (6.0, False)])
def test_a_latency_limit_holds_only_if_it_holds_at_either_end_of_the_clock_bound(
    bound_ms: float, passed: bool
) -> None:
    """p95 39 ms against --max-p95-ms 44: passed where the clocks are aligned within ±0.5 ms,
    not within ±6 (the p95 may have been 45); a stream with no latency fails as unmeasured."""
    measured, twin = _stream(0, 0.1), _stream(1, 0.1)
    measured.latency_ms = [20.0 + 20.0 * i / 99 for i in range(100)]  # p95 39.0
    measured.clock = {"offset_ms": 3.0, "error_bound_ms": bound_ms, "rtt_ms": 9.0}
    config = _config(max_p95_ms=44.0)
    unmeasured = _stream(1, 0.1)
    assert _report(config, [measured, unmeasured])["verdict"]["passed"] is False  # type: ignore[index]
    twin.latency_ms, twin.clock = measured.latency_ms, measured.clock
    verdict = _report(config, [measured, twin])["verdict"]
    assert verdict["passed"] is passed, verdict  # type: ignore[index]
    if not passed:
        assert (
            "2 stream(s) with p95 latency plus their clock's error bound above 44 ms, or "
            "unmeasured (#0, #1)" in verdict["line"]  # type: ignore[index]
        )


def test_rates_are_over_the_time_a_stream_streamed() -> None:
    # up only for the last 5 s of a 22 s run, at the full rate: 30 fps and 1000 B × 30 / s
    report = _report(_config(), [_stream(0, 0.1), _stream(1, END_S - 5.0)])
    late = report["streams"][1]  # type: ignore[index]
    assert late["streamed_s"] == pytest.approx(5.0, abs=0.05)
    assert late["fps"] == pytest.approx(30.0, abs=0.1)
    assert late["mbps"] == pytest.approx(30 * 1000 * 8 / 1e6, rel=0.01)
    # the hold began when it came up: both streams held the rate over it
    assert report["aggregate"]["hold_start_s"] == pytest.approx(END_S - 5.0)  # type: ignore[index]
    assert late["fps_hold"] == pytest.approx(30.0, abs=0.3)
    assert report["verdict"]["passed"], report["verdict"]  # type: ignore[index]


def test_freezes_count_in_the_hold_for_the_part_of_them_it_holds() -> None:
    config = _config(streams=1)
    early = _stream(0, 0.1)
    early.freeze_events = [(1.5, 400.0)]  # ended before the hold began (ramp: 2 s)
    assert _report(config, [early])["streams"][0]["freezes_hold"] == 0  # type: ignore[index]
    tail = _stream(0, 0.1, last_s=END_S - 0.3)
    tail.freeze_events = [(END_S + 0.5, 800.0)]  # began before the end, seen at the close
    assert _report(config, [tail])["streams"][0]["freezes_hold"] == 1  # type: ignore[index]
    closing = _stream(0, 0.1)
    closing.freeze_events = [(END_S + 0.5, 300.0)]  # began after the run's end
    assert _report(config, [closing])["streams"][0]["freezes_hold"] == 0  # type: ignore[index]
    # a gap of 120 ms (over the 100 ms of three frame intervals at 30 fps) that ends 110 ms
    # after the hold, as the harness closes the other streams: 10 ms of it in the hold
    teardown = _stream(0, 0.1)
    teardown.freeze_events = [(END_S + 0.11, 120.0)]
    summary = _report(config, [teardown])["streams"][0]  # type: ignore[index]
    assert summary["freezes_hold"] == 0
    ramp = _stream(0, 0.1)  # one that began 10 ms before the hold and ended 110 ms into it
    ramp.freeze_events = [(RAMP_S + 0.11, 120.0)]
    summary = _report(config, [ramp])["streams"][0]  # type: ignore[index]
    assert summary["freezes_hold"] == 1 and summary["freeze_ms_hold"] == pytest.approx(110.0)
    ramp.freeze_events = [(RAMP_S + 0.09, 120.0)]  # 90 ms of it in the hold: no freeze there
    assert _report(config, [ramp])["streams"][0]["freezes_hold"] == 0  # type: ignore[index]


def test_the_drag_is_seeded_per_stream_and_moves_the_camera_on_every_tick() -> None:
    def first(seed: int, index: int, n: int = 400) -> list[dict[str, object]]:
        events = drag_events(seed, index, 60.0)
        return [next(events) for _ in range(n)]

    assert first(1, 0) == first(1, 0)
    assert first(1, 0) != first(1, 1) and first(1, 0) != first(2, 0)
    events = first(3, 2, 2000)
    assert events[0]["action"] == "down"
    moves = [e for e in events if e["action"] == "move"]
    assert all(e["buttons"] == 1 and e["dx"] != 0 for e in moves)  # an orbit: yaw changes
    assert sum(1 for e in events if e["action"] == "up") >= 2  # strokes, not one long press
    for before, after in zip(events, events[1:], strict=False):
        if before["action"] == "up":
            assert after["action"] == "down"  # no pause between strokes
    # pitch wanders but stays bounded (never pinned at a clamp, where moves would not show)
    pitch = 0.0
    for e in moves:
        pitch += float(e["dy"])  # type: ignore[arg-type]
        assert abs(pitch) <= MAX_PITCH_DRIFT + 1e-9


def test_a_stream_queued_the_whole_run_fails_against_a_real_server(tmp_path: Path) -> None:
    serve = ("--encoder", "replay", "--resolution", "320x240", "--fps", "30", "--slots", "1")
    with serve_process(*serve, log_path=tmp_path / "serve.log") as url:
        done = subprocess.run(
            [sys.executable, "-m", "render_server", "loadtest", "--server", url, "--streams", "2",
             "--resolution", "320x240", "--fps", "30", "--duration", "4", "--ramp", "0.5",
             "--report", str(tmp_path / "report"), "--json"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    up, queued = report["streams"]
    assert up["state"] == "closed" and up["frames"] > 0
    assert queued["state"] == "failed" and queued["never_started"] and queued["frames"] == 0
    assert "queued at position 1" in queued["reason"], queued["reason"]
    assert report["aggregate"]["failed"] == 1 and report["aggregate"]["up_to_the_end"] == 1
    assert "never started (#1)" in report["verdict"]["line"]
