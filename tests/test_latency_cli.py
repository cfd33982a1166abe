"""`render-server latency` as a user runs it, against a real `render-server serve`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from render_server.cli.latency import format_report
from render_server.cli.main import build_parser

from .browser import serve_process


def test_latency_is_a_subcommand_with_its_options() -> None:
    args = build_parser().parse_args(["latency", "--url", "http://h:1", "--client", "chromium"])
    assert (args.url, args.client, args.seconds, args.json) == (
        "http://h:1",
        "chromium",
        10.0,
        False,
    )


def test_latency_prints_one_json_document_and_a_table(tmp_path: Path) -> None:
    with serve_process(
        "--resolution", "320x240", "--fps", "20", log_path=tmp_path / "serve.log"
    ) as url:  # fmt: skip
        command = [sys.executable, "-m", "render_server", "latency", "--url", url]
        done = subprocess.run(
            [*command, "--client", "python", "--seconds", "3", "--json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["frames"] > 0 and report["unmatched_records"] == 0
    for name in ("glass_to_glass", "input_to_frame"):
        assert set(report[name]) == {"p50", "p95", "p99", "mean", "count"}
    assert set(report["stages"]) == {"input", "wait", "render", "encode", "send", "network"}
    table = format_report(report, "python")
    assert "glass-to-glass" in table and "input-to-frame" in table


def test_latency_says_plainly_when_there_is_no_server(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "render_server", "latency", "--url", "http://127.0.0.1:9",
         "--seconds", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith("render-server latency: ") and "Traceback" not in done.stderr
