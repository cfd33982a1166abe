"""What receiving costs the load-test harness: RTP packets per harness CPU-second, lean receiver
against aiortc's full receive path, in the same run against the same server.

    python benchmarks/receiver_cost.py [--streams 6] [--hold 15] [--rounds 2]
        [--resolution 1280x720] [--fps 30] [--bitrate 4000000]

One `render-server serve --encoder replay` (the same clip for every session, so both sides get
the same packets), then `render-server loadtest --receiver lean` and `--receiver full` in turns
(`--rounds` of each, alternating, so that drift in the machine's load falls on both). Each
harness process measures its own CPU time (`time.process_time()`, every thread) and the
packets its streams got over the hold, from a second after the ramp to the end
(report.json's `harness.processes[].hold_window`), so imports, handshakes and teardown are
left out. Printed per run and per receiver: packets, CPU seconds, packets per CPU-second, and
the ratio lean / full.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
from render_server.tools.local_server import local_server  # noqa: E402


def run_once(url: str, receiver: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "render_server", "loadtest", "--server", url,
        "--streams", str(args.streams), "--resolution", args.resolution, "--fps", str(args.fps),
        "--duration", str(args.hold), "--ramp", "1", "--receiver", receiver, "--no-drag",
        "--report", str(out), "--json", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"loadtest exited {done.returncode}: {done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    windows = [p["hold_window"] for p in report["harness"]["processes"]]
    packets = sum(w["packets"] for w in windows)
    cpu = sum(w["cpu_s"] for w in windows)
    return {"packets": packets, "cpu_s": cpu, "verdict": report["verdict"]["line"],
            "per_cpu_s": packets / cpu if cpu else float("nan")}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--hold", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--resolution", default="1280x720")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--bitrate", type=int, default=4_000_000)
    args = parser.parse_args()
    totals: dict[str, list[float]] = {"lean": [0.0, 0.0], "full": [0.0, 0.0]}
    with tempfile.TemporaryDirectory() as tmp:
        serve = ("--encoder", "replay", "--resolution", args.resolution, "--fps", str(args.fps),
                 "--bitrate", str(args.bitrate), "--slots", str(args.streams))  # fmt: skip
        with local_server(*serve, log_path=Path(tmp) / "serve.log", cwd=ROOT) as server:
            for round_ in range(args.rounds):
                for receiver in ("lean", "full") if round_ % 2 == 0 else ("full", "lean"):
                    figures = run_once(server.url, receiver, args, Path(tmp) / receiver)
                    totals[receiver][0] += figures["packets"]
                    totals[receiver][1] += figures["cpu_s"]
                    print(f"round {round_ + 1} {receiver:>4}: {figures['packets']} packets in "
                          f"{figures['cpu_s']:.2f} CPU-s = {figures['per_cpu_s']:,.0f}/CPU-s "
                          f"({figures['verdict']})", flush=True)  # fmt: skip
    rates = {k: p / c if c else float("nan") for k, (p, c) in totals.items()}
    for receiver, (packets, cpu) in totals.items():
        print(f"{receiver:>4}: {packets:.0f} packets in {cpu:.2f} CPU-s = "
              f"{rates[receiver]:,.0f} packets per harness CPU-second")  # fmt: skip
    print(f"lean / full: {rates['lean'] / rates['full']:.2f}×")


if __name__ == "__main__":
    main()
