"""`render-server loadtest` against a real `render-server serve --encoder replay`: real aiortc
peers through the signaling API, the report checked against the worker's own `/metrics`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from render_server.config import Resolution
from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.report import write_report
from render_server.tools.loadtest.runner import Progress, run_loadtest
from render_server.tools.loadtest.server import (
    ServerApi,
    parse_prometheus,
    server_check,
    worker_counters,
)
from render_server.tools.measure.frames import ObservedFrame

from .browser import free_port, serve_process
from .support import observed_frame, timing_record

SERVE = ("--encoder", "replay", "--resolution", "320x240", "--fps", "30", "--slots", "4")


def _loadtest(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_server", "loadtest", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize("processes", [1, 2])
def test_a_short_run_agrees_with_the_worker_metrics(tmp_path: Path, processes: int) -> None:
    with serve_process(*SERVE, log_path=tmp_path / "serve.log") as url:
        done = _loadtest(
            "--server", url, "--streams", "3", "--resolution", "320x240", "--fps", "30",
            "--duration", "9", "--ramp", "1", "--processes", str(processes),
            "--decode-every", "30", "--min-fps", "20", "--report", str(tmp_path / "report"),
            "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report == json.loads((tmp_path / "report" / "report.json").read_text())
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "PASS" in html

    assert report["mode"]["encoders"] == ["replay"] and report["mode"]["replay"]
    assert report["config"]["processes"] == processes
    assert len(report["harness"]["processes"]) == processes
    streams = report["streams"]
    assert [s["state"] for s in streams] == ["closed"] * 3
    for s in streams:
        assert s["quality_applied"]["width"] == 320 and s["quality_applied"]["height"] == 240
        assert s["frames"] > 0 and s["bytes"] > 0 and s["keyframes"] >= 1
        assert s["setup_ms"] is not None and s["setup_ms"] > 0
        assert s["latency_ms"]["count"] > 0 and s["latency_ms"]["p50"] >= 0
        assert s["decode_ok"] and s["decode"]["sizes"] == {"320x240": s["decode"]["decoded"]}
        assert s["fps_hold"] > 20 and s["freezes_hold"] == 0
        assert len(s["series"]["fps"]) >= 9
    check = report["server_check"]
    assert check["server_sessions_started"] == 3
    assert check["harness_frames"] == sum(s["frames"] for s in streams)
    assert check["harness_bytes"] == sum(s["bytes"] for s in streams)
    assert abs(check["frames_ratio"] - 1) <= 0.02, check
    assert abs(check["bytes_ratio"] - 1) <= 0.02, check
    assert report["verdict"] == {"passed": True, "line": "PASS", "reasons": []}


@pytest.mark.parametrize("codec", ["VP8", "AV1"])
def test_a_run_in_vp8_or_av1_counts_and_decodes_that_codec(tmp_path: Path, codec: str) -> None:
    """The harness receives any codec: frames closed on the marker bit, keyframes told by the
    codec's payload format, sampled ones decoded (libvpx, SVT-AV1 on the worker)."""
    serve = ("--renderer", "cpu", "--resolution", "320x240", "--fps", "30", "--animate")
    with serve_process(*serve, log_path=tmp_path / "serve.log") as url:
        done = _loadtest(
            "--server", url, "--streams", "2", "--resolution", "320x240", "--fps", "30",
            "--duration", "4", "--ramp", "0.5", "--codec", codec.lower(), "--decode", "every", "15",
            "--min-fps", "20",
            "--report", str(tmp_path / "report"), "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["config"]["codec"] == codec
    for s in report["streams"]:
        assert s["state"] == "closed" and s["frames"] > 60 and s["keyframes"] >= 1, s
        assert s["decode_ok"] and s["decode"]["decoded"] >= 1 and s["decode"]["errors"] == 0
    assert report["verdict"]["passed"]


def test_a_codec_the_worker_does_not_send_fails_each_stream_naming_both(tmp_path: Path) -> None:
    with serve_process(*SERVE, log_path=tmp_path / "serve.log") as url:  # replay: H.264 only
        done = _loadtest(
            "--server", url, "--streams", "1", "--resolution", "320x240", "--duration", "2",
            "--ramp", "0", "--codec", "VP8", "--report", str(tmp_path / "report"), "--json",
        )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    (stream,) = json.loads(done.stdout)["streams"]
    assert stream["state"] == "failed"
    assert "the browser offers VP8; this worker sends H264" in stream["reason"], stream["reason"]


def test_a_stream_the_worker_stops_is_a_failure_with_its_reason(tmp_path: Path) -> None:
    with serve_process(*SERVE, log_path=tmp_path / "serve.log") as url:
        config = LoadTestConfig(
            server=url, streams=3, resolution=Resolution(320, 240), fps=30.0, duration_s=8.0,
            ramp_s=1.0, processes=1, min_fps=20.0,
        )  # fmt: skip
        api = ServerApi(url)
        ended: list[int] = []

        def stop_stream_one(progress: Progress) -> None:
            target = progress.streams[1]
            if not ended and progress.elapsed_s > 3.0 and target.session_id:
                # a REST call from another thread while the harness runs
                thread = threading.Thread(
                    target=lambda: ended.append(api.end_session(str(target.session_id)))
                )
                thread.start()
                thread.join()

        run = run_loadtest(config, stop_stream_one)
        report, summary = write_report(run, tmp_path)
    assert ended == [202]
    stopped, others = report["streams"][1], [report["streams"][0], report["streams"][2]]
    assert stopped["state"] == "failed"
    assert "ended_by_api" in stopped["reason"]
    assert all(s["state"] == "closed" for s in others)
    assert stopped["streamed_s"] < min(s["streamed_s"] for s in others) - 2.0
    assert stopped["fps_hold"] < 20.0  # its silence stays in the hold window
    assert report["aggregate"]["failed"] == 1
    verdict = report["verdict"]
    assert not verdict["passed"] and verdict["line"].startswith("FAIL")
    assert "1 stream(s) failed (#1)" in verdict["line"]
    assert summary.splitlines()[-1] == verdict["line"]
    assert "ended_by_api" in summary
    # the server counted what the harness saw, the stopped stream included
    assert abs(report["server_check"]["frames_ratio"] - 1) <= 0.02


def test_bad_arguments_exit_2_with_a_message(tmp_path: Path) -> None:
    report = str(tmp_path / "r")
    cases = [
        (["--server", "http://127.0.0.1:1", "--streams", "0", "--report", report], "--streams"),
        (["--server", "http://127.0.0.1:1", "--resolution", "big", "--report", report], "big"),
        (["--server", "ftp://x", "--report", report], "--server"),
        (["--server", "http://127.0.0.1:1", "--duration", "soon", "--report", report], "soon"),
        (["--server", "http://127.0.0.1:1"], "--report"),
    ]
    for args, word in cases:
        done = _loadtest(*args, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert word in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_an_unreachable_server_exits_2_with_a_message(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _loadtest("--server", url, "--streams", "1", "--report", str(tmp_path), timeout=30)
    assert done.returncode == 2
    assert f"cannot reach {url}" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "report.json").exists()


def test_worker_counters_sum_over_labels() -> None:
    text = (
        "# HELP worker_keyframes_total Keyframes\n"
        'worker_keyframes_total{reason="start"} 3.0\n'
        'worker_keyframes_total{reason="request"} 2.0\n'
        "worker_frames_encoded_total 120.0\n"
        "worker_frames_encoded_created 1.7e+09\n"
        "worker_frame_bytes_total 5e+05\n"
    )
    assert parse_prometheus(text)['worker_keyframes_total{reason="start"}'] == 3.0
    counters = worker_counters(text)
    assert counters == {"frames": 120.0, "bytes": 5e5, "keyframes": 5.0, "sessions_started": 0.0,
                        "transport_feedback": 0.0, "loop_timers": 0.0, "media_packets": 0.0,
                        "full_collections": 0.0, "full_collection_s": 0.0,
                        "loop_timers_prompt": 0.0, "session_pauses": 0.0}  # fmt: skip
    text += 'worker_paced_packets_total{kind="media"} 900.0\n'
    text += 'worker_paced_packets_total{kind="padding"} 40.0\n'
    text += 'python_gc_pause_seconds_count{generation="0"} 500.0\n'
    text += 'python_gc_pause_seconds_count{child="0",child_pid="9",generation="2"} 3.0\n'
    text += 'python_gc_pause_seconds_count{generation="2"} 1.0\n'
    text += 'python_gc_pause_seconds_sum{generation="2"} 0.25\n'
    text += 'python_event_loop_lag_seconds_bucket{le="0.05"} 95.0\n'
    text += "python_event_loop_lag_seconds_count 100.0\n"
    text += 'worker_session_pauses_total{child="0",child_pid="9"} 2.0\n'
    text += 'worker_session_pauses_total{child="1",child_pid="10"} 1.0\n'
    text += 'python_event_loop_lag_seconds_bucket{child="0",child_pid="9",le="0.05"} 38.0\n'
    text += 'python_event_loop_lag_seconds_bucket{child="0",child_pid="9",le="0.1"} 40.0\n'
    text += 'python_event_loop_lag_seconds_count{child="0",child_pid="9"} 40.0\n'
    counters = worker_counters(text)
    assert counters["media_packets"] == 900.0
    assert counters["full_collections"] == 4.0 and counters["full_collection_s"] == 0.25
    assert counters["loop_timers"] == 140.0 and counters["loop_timers_prompt"] == 133.0
    before = dict.fromkeys(counters, 0.0)
    check = server_check(before, counters, None, 120, 5 * 10**5, 900)
    assert check["server_late_timers"] == 7 and check["frames_ratio"] == 1.0
    assert check["server_session_pauses"] == 3  # summed over a pool's children


def test_the_sampling_assembler_keeps_only_sampled_keyframes() -> None:
    from render_server.tools.loadtest.sampling import SamplingAssembler

    kept: list[tuple[int, bool, int]] = []

    def on_frame(frame: ObservedFrame, access_unit: bytes) -> None:
        kept.append((frame.rtp, frame.keyframe, len(access_unit)))

    assembler = SamplingAssembler(on_frame, every=3)
    idr, p_slice = bytes([0x65, 0x88, 0x84]), bytes([0x41, 0x9A, 0x00])
    for i, payload in enumerate([idr, p_slice, idr, p_slice, p_slice, p_slice, idr]):
        assembler.add(i, 1000 * i, 1, payload, float(i))
    # the first keyframe, then the next keyframe at least 3 frames on; never a P frame
    assert [(rtp, key) for rtp, key, size in kept if size] == [(0, True), (6000, True)]


def test_frame_latencies_keep_two_times_per_complete_frame_and_bounded_waiting() -> None:
    from render_server.tools.loadtest.frame_latency import MAX_WAITING, FrameLatencies

    latencies = FrameLatencies()
    # before any pong: no live figure, kept for the end
    latencies.add_frame(observed_frame(1, 20.0))
    latencies.add_record(timing_record(1, 1010.0))
    latencies.clock.add(0.0, 1000.0, 2.0)  # worker = client + 999
    latencies.add_record(timing_record(2, 1040.0))  # its frame comes later
    latencies.add_frame(observed_frame(2, 50.0))
    latencies.add_frame(observed_frame(3, 80.0, complete=False))  # no latency from a lossy frame
    latencies.add_record(timing_record(3, 1070.0))
    assert latencies.take_recent() == [pytest.approx(9.0)] and latencies.take_recent() == []
    assert latencies.series() == [(20.0, 9.0), (50.0, 9.0)]
    for rtp in range(10, 10 + 2 * MAX_WAITING):  # records of frames that never arrive
        latencies.add_record(timing_record(rtp, 0.0))
    assert len(latencies.waiting_records) == MAX_WAITING
