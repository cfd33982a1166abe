"""Chaos with a fixed seed: a real fleet (redis-server, two replicas, three workers, pages that
stream and pages that wait in the queue) takes every kind of fault once, in a seeded order, and
after each one settles the fleet must hold: slots used == sessions streaming, every page streams
again or waits in the queue (none ended without asking), and the queue is served in order.

The times each fault cost (p50/max over repeated runs, against the 3 s target) are
`benchmarks/chaos.py`'s to print: a timed assertion has no place on a shared machine.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from .chaos import ChaosFleet, faults
from .redis_server import running_redis

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(600)]

SEED = 20261201


# the test's names for the kinds of fault it takes (their order seeds the sequence)
NAMES = {
    "kill -9 a worker": "worker-kill",
    "SIGTERM a worker": "worker-sigterm",
    "kill -9 a replica": "replica-kill",
    "stop Redis for 10 s": "redis-stop",
    "a queued page vanishes": "queued-page-vanishes",
    "a page ends its session": "page-ends-session",
}


async def test_a_seeded_sequence_of_faults_leaves_the_fleet_whole(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    with running_redis() as redis:
        fleet = ChaosFleet(redis, tmp_path)
        try:
            fleet.start_replicas()
            for _ in range(3):
                fleet.add_worker()
            await fleet.wait_workers(3)
            await fleet.stream(6)  # every slot taken
            await fleet.queue_up(3)
            every = faults(fleet, rng)
            kinds = {name: every[kind] for name, kind in NAMES.items()}
            order = sorted(kinds)
            rng.shuffle(order)
            report = []
            for name in order:
                outcome = await fleet.apply(name, kinds[name])
                report.append(f"{outcome.fault}: {outcome.problems or 'whole'}")
                assert not outcome.problems, "\n".join(report)
        finally:
            await fleet.close()
            for proc in [*fleet.replicas, *fleet.workers.values()]:
                if proc.process.poll() is None:
                    proc.process.kill()
                    proc.process.wait(10)
