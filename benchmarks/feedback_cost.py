"""What clients that report every packet cost the server, against clients that do not.

    python benchmarks/feedback_cost.py [--streams 6] [--rounds 2] [--hold 10]
        [--profile 4k60|720p30]

Browsers send transport-cc feedback (every packet's arrival, every 50-100 ms), and the worker
then runs its congestion controller and pacer on each packet (`send_path`); the load-test
harness by default sends REMB only, the cheap path. This prints what the difference costs.

One `render-server serve --encoder replay` server (`--streams` slots of 3840x2160 at 60 fps and
25 Mbit/s, or 1280x720 at 30 fps and 4 Mbit/s), started once; against it, `render-server
loadtest --receiver lean` in turns without and with `--transport-feedback` (REMB first),
`--rounds` runs each, `--hold` s held after a 2 s ramp. The two sides differ only in that flag:
same server, clip, streams, harness and drag. For each run, over its hold (every stream up):
the RTP packets the harness got per second (summed over its processes), the frames per second,
and the server's cores (its CPU time, sampled every 0.2 s and interpolated at the hold's edges);
then per side the packets per server CPU-second, and the ratio REMB / transport-cc: how many
times a packet's server CPU the feedback path costs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from loadtest import (  # noqa: E402  (benchmarks/loadtest.py)
    SEND_PROFILES,
    cpu_between,
    replay_args,
    serve,
)
from loadtest import loadtest as run_loadtest  # noqa: E402


def _hold(report: dict[str, Any], samples: list[tuple[float, float]]) -> dict[str, float]:
    """Packets/s, frames/s and the server's cores over the hold, where every harness process
    measured (the intersection of their windows)."""
    windows = [p["hold_window"] for p in report["harness"]["processes"] if p.get("hold_window")]
    if not windows:
        raise RuntimeError("the harness measured no hold window (did every stream start?)")
    start = max(w["start_ms"] for w in windows)
    end = min(w["end_ms"] for w in windows)
    cores = cpu_between(samples, start, end) / ((end - start) / 1e3)
    packets = sum(w["packets"] / w["seconds"] for w in windows)
    fps = report["aggregate"]["fps_hold_total"]
    return {"packets_s": packets, "fps": fps, "cores": cores, "seconds": (end - start) / 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, in turns")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds held in each run")
    parser.add_argument("--profile", choices=sorted(SEND_PROFILES), default="4k60")
    args = parser.parse_args()
    size, fps, bitrate = SEND_PROFILES[args.profile]  # (c)'s streams in loadtest.py
    work = Path(tempfile.mkdtemp(prefix="feedback-cost-"))
    serve_args = replay_args(size, fps, bitrate, args.streams)
    sides: dict[str, list[dict[str, float]]] = {"REMB": [], "transport-cc": []}
    t0 = time.monotonic()
    with serve(*serve_args, log=work / "serve.log") as (url, pid, command):
        print("server: python " + " ".join(shlex.quote(c) for c in command[1:]), flush=True)
        for round_ in range(args.rounds):
            for side, extra in (("REMB", ()), ("transport-cc", ("--transport-feedback",))):
                samples: list[tuple[float, float]] = []
                report, _, how = run_loadtest(
                    url, pid, work / f"{side}-{round_}", "--streams", str(args.streams),
                    "--resolution", size, "--fps", f"{fps:g}", "--duration", f"{args.hold + 2:g}",
                    "--ramp", "2", "--receiver", "lean", "--processes", "2", *extra,
                    cpu_samples=samples,
                )  # fmt: skip
                hold = _hold(report, samples)
                sides[side].append(hold)
                agg = report["aggregate"]
                print(
                    f"[{time.monotonic() - t0:4.0f} s] {side:>12}: {hold['packets_s']:8,.0f} "
                    f"packets/s, {hold['fps']:6.1f} fps in all (min {agg['fps_hold_min']:.1f} a "
                    f"stream), over {hold['seconds']:.1f} s; server {hold['cores']:.2f} cores: "
                    f"{hold['packets_s'] / hold['cores']:,.0f} packets per CPU-second; feedback "
                    f"sent {agg['feedback_sent']}, lost packets {agg['lost_packets']}\n    {how}",
                    flush=True,
                )
    per_cpu = {}
    print(f"\n{args.streams} × {args.profile} replay, {args.rounds} runs a side, reports in {work}")
    for side, holds in sides.items():
        packets = sum(h["packets_s"] * h["seconds"] for h in holds)
        cpu = sum(h["cores"] * h["seconds"] for h in holds)
        frames = sum(h["fps"] * h["seconds"] for h in holds)
        seconds = sum(h["seconds"] for h in holds)
        per_cpu[side] = packets / cpu
        print(
            f"  {side:>12}: {packets:,.0f} packets, {frames:,.0f} frames ({frames / seconds:.1f} "
            f"fps in all) in {seconds:.1f} s; server {cpu:.2f} CPU-s: {per_cpu[side]:,.0f} "
            "packets per CPU-second"
        )
    ratio = per_cpu["REMB"] / per_cpu["transport-cc"]
    print(f"  a packet under transport-cc costs the server {ratio:.2f}× its CPU under REMB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
