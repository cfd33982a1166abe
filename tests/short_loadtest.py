"""A short real load test: 2 streams of 320x240 at 30 fps for 5 s against a replaying worker,
with the harness's extra arguments; its report.json (the run must pass)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .browser import serve_process


def short_loadtest(tmp_path: Path, *harness_args: str) -> dict[str, Any]:
    serve = ("--encoder", "replay", "--resolution", "320x240", "--fps", "30", "--slots", "2")
    with serve_process(*serve, log_path=tmp_path / "serve.log") as url:
        done = subprocess.run(
            [sys.executable, "-m", "render_server", "loadtest", "--server", url, "--streams", "2",
             "--resolution", "320x240", "--fps", "30", "--duration", "5", "--ramp", "0.5",
             "--min-fps", "20", *harness_args, "--report", str(tmp_path / "report"), "--json"],
            capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report
