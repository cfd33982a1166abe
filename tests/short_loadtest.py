"""A short real load test: 2 streams of 320x240 at 30 fps for 5 s against a replaying worker,
with the harness's extra arguments; its report.json (the run must pass, but for short freezes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from render_server.cli.loadtest import EXIT_FAIL, EXIT_PASS

from .browser import serve_process

FROZE = "froze in the hold"
# A freeze is a gap of over three frame intervals (100 ms here). On the shared CI machine, three
# test processes on two cores, a stream once froze 120 and 151 ms in a run that counted every
# packet right: that fails the load test's verdict, not what these tests check. Longer is a stall.
MAX_FREEZE_MS = 500.0


def short_loadtest(tmp_path: Path, *harness_args: str) -> dict[str, Any]:
    serve = ("--encoder", "replay", "--resolution", "320x240", "--fps", "30", "--slots", "2")
    with serve_process(*serve, log_path=tmp_path / "serve.log") as url:
        done = subprocess.run(
            [sys.executable, "-m", "render_server", "loadtest", "--server", url, "--streams", "2",
             "--resolution", "320x240", "--fps", "30", "--duration", "5", "--ramp", "0.5",
             "--min-fps", "20", *harness_args, "--report", str(tmp_path / "report"), "--json"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    said = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode in (EXIT_PASS, EXIT_FAIL) and done.stdout.lstrip().startswith("{"), said
    report: dict[str, Any] = json.loads(done.stdout)
    reasons = report["verdict"]["reasons"]
    assert done.returncode == EXIT_PASS or reasons, said
    assert [r for r in reasons if FROZE not in r] == [], reasons
    for stream in report["streams"]:
        assert stream["longest_gap_ms"] < MAX_FREEZE_MS, stream
    return report
