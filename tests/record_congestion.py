"""Record a real session's congestion-controller inputs for tests/test_congestion_recorded.py.

    python -m tests.record_congestion

Runs the lab's step (tests/lab_step.py: Chromium dragging a 1280x720@30 stream while the link
goes 20 → 2 → 20 Mbit/s at 40 ms RTT) with `--record-congestion`, and keeps the recording
(the browser's transport feedback and the packets sent, as the controller got them) in
tests/data/congestion/ beside a JSON file of the step times on the recording's clock. Root
only (the lab); commit what it writes after looking at its figures.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

from .lab_step import run_step

DATA = Path(__file__).parent / "data" / "congestion"
NAME = "chromium-step-20-2-20"


def main() -> int:
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        result = run_step("paced", before_s=5.0, low_s=8.0, after_s=12.0, record_dir=Path(folder))
        recordings = sorted(Path(folder).glob("*.jsonl.gz"), key=lambda p: p.stat().st_size)
        if not recordings:
            print("no recording was written", file=sys.stderr)
            return 1
        shutil.copy(recordings[-1], DATA / f"{NAME}.jsonl.gz")  # the streaming peer's
    down, up = result["monotonic_steps"]
    meta = {
        "link": "40 ms RTT, 20 Mbit/s, then 2 Mbit/s, then 20 Mbit/s (tbf)",
        "stream": "1280x720@30, x264, paced send path; Chromium dragging throughout",
        "step_down": down,
        "step_up": up,
        "target_before_bps": result["target_before_bps"],
        "live": {k: result[k] for k in ("target_under_2mbit_after_s",
                                        "target_back_to_90pct_after_step_up_s")},
    }  # fmt: skip
    (DATA / f"{NAME}.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
