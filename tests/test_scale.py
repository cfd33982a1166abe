"""Scale-out against real processes: a real Redis, two signaling replicas, three worker
processes (real renderers at 64×64), 50 concurrent browsers' signaling sockets."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .processes import (
    Process,
    SignalClient,
    start_signaling,
    start_worker,
    stopping,
    token,
    wait_for_workers,
    workers,
)
from .redis_server import redis_server

pytestmark = pytest.mark.asyncio

SLOTS = 2
GRACE_S = 3.0


@dataclass
class Cluster:
    replicas: list[Process]
    workers: dict[str, Process]


# 50 browsers on one loopback address, holding sessions without media: placement is what these
# tests watch, so neither the per-address cap nor the offer deadline applies
PLACEMENT_ONLY = ("--max-sessions-per-address", "0", "--offer-timeout", "300")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with redis_server() as url:
        options = ("--resume-grace", str(GRACE_S), *PLACEMENT_ONLY)
        r1 = start_signaling("replica-1", url, tmp_path, *options)
        r2 = start_signaling("replica-2", url, tmp_path, *options)
        with stopping(r1, r2):
            ws = {
                "worker-a": start_worker("worker-a", r1, tmp_path, SLOTS),
                "worker-b": start_worker("worker-b", r2, tmp_path, SLOTS),
                "worker-c": start_worker("worker-c", r1, tmp_path, SLOTS),
            }
            with stopping(*ws.values()):
                wait_for_workers(r2, 3, list(ws.values()))  # all three seen from either replica
                yield Cluster([r1, r2], ws)


async def clients(cluster: Cluster, count: int) -> list[SignalClient]:
    made = [
        SignalClient(cluster.replicas[i % 2].ws, token("controller", f"user-{i}"))
        for i in range(count)
    ]
    await asyncio.gather(*(c.connect() for c in made))
    return made


def slots_used(cluster: Cluster) -> dict[str, int]:
    return {w["id"]: w["slots"] - w["free"] for w in workers(cluster.replicas[0])}


async def test_fifty_browsers_get_one_slot_each_in_order(cluster: Cluster) -> None:
    browsers = await clients(cluster, 50)
    try:
        await asyncio.gather(*(b.send(type="session.start") for b in browsers))
        first = await asyncio.gather(*(b.next("session.started", "queue") for b in browsers))
        started = [
            b for b, m in zip(browsers, first, strict=True) if m["type"] == "session.started"
        ]
        waiting = {
            b: m["position"] for b, m in zip(browsers, first, strict=True) if m["type"] == "queue"
        }
        assert len(started) == 3 * SLOTS
        assert sorted(waiting.values()) == list(range(1, 51 - 3 * SLOTS))  # one queue for all
        assert slots_used(cluster) == {"worker-a": SLOTS, "worker-b": SLOTS, "worker-c": SLOTS}

        sessions = {m["sessionId"] for m in first}
        assert len(sessions) == 50
        order = sorted(waiting, key=waiting.__getitem__)  # the order the queue must serve
        served: list[SignalClient] = []
        active = list(started)
        while order:
            leaving = active.pop(0)
            await leaving.send(type="session.end")
            assert (await leaving.next("session.ended"))["reason"] == "client_ended"
            expected = order.pop(0)
            message = await expected.next("session.started")  # the next in line, nobody else
            served.append(expected)
            active.append(expected)
            used = slots_used(cluster)
            assert all(n <= SLOTS for n in used.values()), used
            assert sum(used.values()) == 3 * SLOTS  # every freed slot taken again at once
            assert message["sessionId"] in sessions
        # everyone got exactly one slot, and waited with positions that only went down
        for b in browsers:
            starts = [m for m in b.seen if m["type"] == "session.started"]
            assert len(starts) == 1, b.seen
            positions = [m["position"] for m in b.seen if m["type"] == "queue"]
            assert positions == sorted(positions, reverse=True)
            if positions:
                assert positions[-1] == 1
    finally:
        await asyncio.gather(*(b.close() for b in browsers))


async def wait_replaced(browser: SignalClient, old_worker: str) -> dict[str, str]:
    interrupted = await browser.next("session.interrupted", timeout=20)
    restarted = await browser.next("session.started", timeout=20)
    assert restarted["sessionId"] == interrupted["sessionId"]
    assert restarted["workerId"] != old_worker
    return {"reason": interrupted["reason"], "worker": restarted["workerId"]}


@pytest.mark.parametrize(
    ("how", "reason"),
    [(signal.SIGKILL, "worker_disconnected"), (signal.SIGSTOP, "heartbeat_timeout")],
    ids=["killed", "frozen"],
)
async def test_a_lost_workers_sessions_are_told_and_placed_again(
    cluster: Cluster, how: signal.Signals, reason: str
) -> None:
    browsers = await clients(cluster, 4)
    try:
        await asyncio.gather(*(b.send(type="session.start") for b in browsers))
        starts = await asyncio.gather(*(b.next("session.started") for b in browsers))
        by_worker: dict[str, list[SignalClient]] = {}
        for b, m in zip(browsers, starts, strict=True):
            by_worker.setdefault(m["workerId"], []).append(b)
        victim = max(by_worker, key=lambda w: len(by_worker[w]))
        assert len(by_worker[victim]) == 2  # least loaded first: 1, 1, then 2 on one of them
        cluster.workers[victim].kill(how)  # SIGSTOP: alive socket, no heartbeats
        results = await asyncio.gather(*(wait_replaced(b, victim) for b in by_worker[victim]))
        assert {r["reason"] for r in results} == {reason}
        survivors = [b for w, bs in by_worker.items() if w != victim for b in bs]
        for b in survivors:  # the other sessions noticed nothing
            assert [m["type"] for m in b.seen] == ["session.started"]
        used = slots_used(cluster)
        assert victim not in used and sum(used.values()) == 4
    finally:
        if how == signal.SIGSTOP:
            cluster.workers[victim].kill(signal.SIGCONT)
        await asyncio.gather(*(b.close() for b in browsers))


async def test_a_reload_resumes_the_session_on_another_replica(cluster: Cluster) -> None:
    alice = SignalClient(cluster.replicas[0].ws, token("controller", "alice"))
    await alice.connect()
    await alice.send(type="session.start")
    started = await alice.next("session.started")
    await alice.close()  # the tab reloads: its socket drops, the session waits for it

    again = SignalClient(cluster.replicas[1].ws, token("controller", "alice"))
    intruder = SignalClient(cluster.replicas[1].ws, token("controller", "mallory"))
    await again.connect()
    await intruder.connect()
    try:
        attach = {"sessionId": started["sessionId"], "resumeToken": started["resumeToken"]}
        await intruder.send(type="session.resume", **attach)
        assert (await intruder.next("error"))["code"] == "forbidden"
        await again.send(type="session.resume", **attach)
        resumed = await again.next("session.started")
        assert (resumed["sessionId"], resumed["workerId"]) == (
            started["sessionId"], started["workerId"]
        )  # fmt: skip
        assert "resumeToken" not in resumed  # handed out once
        await asyncio.sleep(GRACE_S + 1)  # past the first replica's grace period: nothing ends
        assert [m["type"] for m in again.seen] == ["session.started"]
        assert slots_used(cluster)[started["workerId"]] == 1
    finally:
        await again.close()
        await intruder.close()
