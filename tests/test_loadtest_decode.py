"""`render-server loadtest --decode all|keyframes|every N|none --decoder auto|cpu|nvdec`: every
frame decoded on the CPU in a real run, and the usage errors, before anything connects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from render_server.tools.loadtest.decoding import _opens, pick_decoder

from .browser import free_port, serve_process

GPU_DECODES = _opens("h264_cuvid")


def _loadtest(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "render_server", "loadtest", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_cpu_decoding_of_all_frames_decodes_every_frame_received(tmp_path: Path) -> None:
    serve = ("--encoder", "replay", "--resolution", "320x240", "--fps", "30", "--slots", "2")
    with serve_process(*serve, log_path=tmp_path / "serve.log") as url:
        done = _loadtest(
            "--server", url, "--streams", "2", "--resolution", "320x240", "--fps", "30",
            "--duration", "4", "--ramp", "0.5", "--min-fps", "20", "--decode", "all",
            "--decoder", "cpu", "--report", str(tmp_path / "report"), "--json",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    for s in report["streams"]:
        decode = s["decode"]
        assert decode["mode"] == "all" and decode["decoder"] == "h264" and decode["kind"] == "cpu"
        assert s["frames"] > 60 and s["incomplete_frames"] == 0
        assert decode["decoded"] == s["frames"], decode
        assert decode["undecodable"] == 0 and decode["dropped"] == 0
        assert decode["sizes"] == {"320x240": s["frames"]}
        assert decode["decode_ms"]["count"] == s["frames"]
        assert 0 < decode["decode_ms"]["p50"] <= decode["decode_ms"]["p95"]
    totals = report["aggregate"]["decode"]
    assert totals["decoded"] == sum(s["frames"] for s in report["streams"])
    assert "decode (all, h264 (cpu))" in (tmp_path / "report" / "report.html").read_text()


@pytest.mark.skipif(GPU_DECODES, reason="this machine has NVDEC: nothing absent to ask for")
def test_nvdec_where_there_is_none_is_a_usage_error(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never reached: the check comes first
    done = _loadtest("--server", url, "--decoder", "nvdec", "--report", str(tmp_path), timeout=30)
    assert done.returncode == 2, done.stderr
    assert "--decoder nvdec: h264_cuvid does not open here" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "cannot reach" not in done.stderr
    # auto falls back to the CPU; cpu never looks for a GPU
    assert pick_decoder("auto", "H264") == ("h264", "cpu")
    assert pick_decoder("cpu", "AV1") == ("libdav1d", "cpu")


@pytest.mark.parametrize("words", [["every", "0"], ["every"], ["sometimes"], ["all", "2"]])
def test_a_bad_decode_mode_is_a_usage_error(tmp_path: Path, words: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _loadtest("--server", url, "--decode", *words, "--report", str(tmp_path), timeout=30)
    assert done.returncode == 2, done.stderr
    assert "--decode must be all, keyframes, every N" in done.stderr, done.stderr
