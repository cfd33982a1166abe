"""How long each fault stops the picture: for every kind of fault, repeated, the time from the fault
until every page it stopped streams again (p50/max), against the issue's target of 3 s.

A real fleet on this machine (tests/chaos.py): a redis-server, two signaling replicas, three
workers of 2 slots (CPU renderer, 64×64 at 10 fps, `--heartbeat-timeout 3`), and four Python
pages that stream and follow their sessions as the SDK does, so that two slots are spare (the
headroom an autoscaler keeps). A page is "stopped" when no frame reached it for over 1 s; the
baseline is the longest frame gap of the same pages over a quiet window of the same length,
measured in the same run.

    python benchmarks/chaos.py [--runs 3] [--outage 10] [--only worker-kill,redis-stop]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from render_server.tools.stats import percentile  # noqa: E402
from tests.chaos import ChaosFleet, Outcome, faults  # noqa: E402
from tests.redis_server import running_redis  # noqa: E402

TARGET_S = 3.0
PAGES = 4


# the replacement worker or the restarted replica starts once the fault is measured: its
# start-up takes this 2-core machine's CPU for a second (the chaos test restarts at once and
# shows that cost; a cluster starts it on another node)
KINDS = ("worker-kill", "worker-sigterm", "worker-freeze", "replica-kill", "replica-sigterm",
         "redis-stop", "redis-pause")  # fmt: skip


async def quiet_gap(fleet: ChaosFleet, seconds: float) -> float:
    """The longest frame gap of the streaming pages over `seconds` without a fault."""
    start = time.monotonic()
    await asyncio.sleep(seconds)
    end = time.monotonic()
    return max(v.longest_gap(start, end) for v in fleet.live_pages())


def clean_up_frozen(fleet: ChaosFleet) -> None:
    for name in fleet.signalled:
        proc = fleet.workers[name]
        if proc.process.poll() is None:
            proc.kill(signal.SIGCONT)
            proc.kill(signal.SIGKILL)


async def run(runs: int, outage_s: float, only: set[str] | None, log_dir: Path) -> int:
    with running_redis() as redis:
        fleet = ChaosFleet(redis, log_dir)
        try:
            fleet.start_replicas()
            for _ in range(3):
                fleet.add_worker()
            await fleet.wait_workers(3)
            await fleet.stream(PAGES)
            baseline = await quiet_gap(fleet, 5.0)
            every = faults(fleet, random.Random(7), outage_s, restart_now=False)
            results: dict[str, list[Outcome]] = {}
            for name in KINDS:
                if only and name not in only:
                    continue
                fault = every[name]
                for _ in range(runs):
                    outcome = await fleet.apply(name, fault)
                    clean_up_frozen(fleet)
                    results.setdefault(name, []).append(outcome)
            report(results, baseline, outage_s)
            return 0 if all(ok(o) for outs in results.values() for o in outs) else 1
        finally:
            await fleet.close()
            for proc in [*fleet.replicas, *fleet.workers.values()]:
                if proc.process.poll() is None:
                    proc.kill(signal.SIGCONT)
                    proc.process.kill()
                    proc.process.wait(10)


def ok(outcome: Outcome) -> bool:
    return not outcome.problems and max(outcome.recovered_s.values(), default=0) < TARGET_S


def report(results: dict[str, list[Outcome]], baseline: float, outage_s: float) -> None:
    print(
        f"{PAGES} pages streaming at 10 fps; baseline (no fault, same run): longest frame gap "
        f"{baseline:.2f} s; Redis outages last {outage_s:g} s; target {TARGET_S:g} s"
    )
    head = f"{'fault':<16} {'runs':>4} {'stopped':>8} {'p50 s':>7} {'max s':>7} {'gap max':>8}"
    print(head + "  verdict")
    for name, outcomes in results.items():
        times = [t for o in outcomes for t in o.recovered_s.values()]
        gap = max(o.longest_gap_s for o in outcomes)
        stopped = sum(len(o.recovered_s) for o in outcomes)
        p50 = f"{percentile(times, 50):7.2f}" if times else f"{'-':>7}"
        top = f"{max(times):7.2f}" if times else f"{'-':>7}"
        verdict = "PASS" if all(ok(o) for o in outcomes) else "FAIL"
        print(f"{name:<16} {len(outcomes):>4} {stopped:>8} {p50} {top} {gap:8.2f}  {verdict}")
        for o in outcomes:
            for problem in o.problems:
                print(f"    {o.fault}: {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each fault")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds Redis is away")
    parser.add_argument("--only", default="", help="comma-separated fault names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n} or None
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        sys.exit(asyncio.run(run(args.runs, args.outage, only, Path(tmp))))


if __name__ == "__main__":
    main()
