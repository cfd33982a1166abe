"""benchmarks/sharing.py at its smallest: it runs, its JSON parses, and the worker encoded each
frame once on the shared side and once per session on the separate one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_sharing_benchmark_runs_and_reports(tmp_path: Path) -> None:
    command = [
        sys.executable, str(ROOT / "benchmarks" / "sharing.py"), "--viewers", "1", "--runs", "1",
        "--seconds", "1", "--warmup", "0.5", "--json", "--log-dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [(w["side"], w["run"]) for w in report["windows"]] == [("shared", 1), ("separate", 1)]
    shared, separate = report["sides"]["shared"], report["sides"]["separate"]
    for side in (shared, separate):
        assert side["pages"] == 2 and side["streams_min"] == 2  # every page got frames
        assert side["cpu_s"] > 0 and side["delivered"] > 0
    assert shared["viewer_sent"] > 0  # the viewer's frames: the owner's, sent again
    assert separate["viewer_sent"] == 0
    # one encode per frame shared, one per session separate (2 here), give or take the edges
    assert separate["encoded"] > 1.4 * shared["encoded"]
    assert report["ratio_separate_over_shared"]["worker_cpu"] > 0
