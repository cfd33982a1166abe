"""Faults on a real fleet, for the chaos test (tests/test_chaos.py) and `benchmarks/chaos.py`.

The fleet: a real redis-server, two signaling replicas on fixed ports (a killed one restarts
where it was), workers with 2 slots each (CPU renderer, 64×64) that know both replicas, and
Python pages (`FollowingViewer`) that stream and follow their sessions as the SDK does, some of
them waiting in the queue. Each fault is applied, then the fleet is given time to settle and
checked: slots used == sessions streaming, every page streams again (or waits in the queue, or
was told why its session ended), and the queue is served in arrival order.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from render_server.tools.following_viewer import FollowingViewer

from .processes import Process, start_signaling, start_worker, token, workers
from .redis_server import RedisServer

FPS = 10
GAP_S = 1.0  # a page without a frame for this long was affected by the fault
SETTLE_S = 30.0
MIN_SETTLE_S = 3.0  # a worker's socket grace (1 s) and a page's frame gap (1 s) show by then
STEADY_S = 2.0
RESTORE_S = 5.0
REPLICA_OPTIONS = ("--resume-grace", "15", "--max-sessions-per-address", "0",
                   "--offer-timeout", "20")  # fmt: skip


@dataclass
class Outcome:
    """One fault: which pages it stopped, and when each streamed again (seconds after)."""

    fault: str
    at: float
    recovered_s: dict[str, float] = field(default_factory=dict)
    longest_gap_s: float = 0.0
    problems: list[str] = field(default_factory=list)


@dataclass
class ChaosFleet:
    redis: RedisServer
    log_dir: Path
    replicas: list[Process] = field(default_factory=list)
    workers: dict[str, Process] = field(default_factory=dict)
    pages: list[FollowingViewer] = field(default_factory=list)
    arrivals: list[FollowingViewer] = field(default_factory=list)  # queued, in arrival order
    served_order: list[str] = field(default_factory=list)
    signalled: set[str] = field(default_factory=set)  # workers told to stop (or killed)
    restore: Callable[[], object] | None = None  # what to undo once a fault is measured
    next_worker: int = 0
    next_page: int = 0

    # -- building -----------------------------------------------------------------------------

    def start_replicas(self) -> None:
        for i in range(2):
            self.replicas.append(
                start_signaling(f"replica-{i + 1}", self.redis.url, self.log_dir, *REPLICA_OPTIONS)
            )

    def add_worker(self, slots: int = 2) -> Process:
        self.next_worker += 1
        name = f"worker-{self.next_worker}"
        first = self.replicas[self.next_worker % 2]
        other = self.replicas[(self.next_worker + 1) % 2]
        proc = start_worker(
            name, first, self.log_dir, slots, "--fps", str(FPS), "--drain-timeout", "20",
            "--signaling", f"ws://127.0.0.1:{other.port}/worker",
        )  # fmt: skip
        self.workers[name] = proc
        return proc

    def page(self) -> FollowingViewer:
        self.next_page += 1
        first = self.next_page % 2
        urls = [self.replicas[first].url, self.replicas[1 - first].url]
        viewer = FollowingViewer(urls, token("controller", f"page-{self.next_page}"),
                                 f"page-{self.next_page}")  # fmt: skip
        self.pages.append(viewer)
        return viewer

    async def wait_workers(self, count: int, timeout: float = 60) -> None:
        await until(lambda: len(self.registered()) == count, timeout, f"{count} workers")

    async def stream(self, count: int) -> None:
        new = [self.page() for _ in range(count)]
        await asyncio.gather(*(v.start() for v in new))

    async def queue_up(self, count: int) -> None:
        for _ in range(count):  # one by one: the arrival order is the order they are served
            viewer = self.page()
            viewer.begin()
            await until(lambda v=viewer: v.queued, 15, f"{viewer.name} queued")  # type: ignore[misc]
            self.arrivals.append(viewer)

    async def close(self) -> None:
        await asyncio.gather(*(v.close() for v in self.pages), return_exceptions=True)

    # -- reading ------------------------------------------------------------------------------

    def registered(self) -> list[dict[str, object]]:
        for replica in self.replicas:
            if replica.process.poll() is None:
                try:
                    return workers(replica)
                except OSError:
                    continue
        return []

    def live_pages(self) -> list[FollowingViewer]:
        return [v for v in self.pages if not v.ended.done() and not v.gone]

    def settled(self) -> bool:
        pages = self.live_pages()
        waiting = [v for v in pages if v.queued]
        streaming = [v for v in pages if v.streaming()]
        if len(waiting) + len(streaming) != len(pages):
            return False
        fleet = self.registered()
        used = sum(int(w["slots"]) - int(w["free"]) for w in fleet)  # type: ignore[call-overload]
        return used == len(streaming)

    # -- faults -------------------------------------------------------------------------------

    async def kill_worker(
        self, rng: random.Random, how: signal.Signals, replace_now: bool = True
    ) -> str:
        """Stop a worker that holds sessions (any, if none does); the autoscaler's replacement
        starts at once, or (`replace_now=False`) once the fault has been measured."""
        alive = {n for n, p in self.workers.items() if p.process.poll() is None} - self.signalled
        busy = {str(w["id"]) for w in self.registered() if w["free"] != w["slots"]} & alive
        name = rng.choice(sorted(busy or alive))
        self.signalled.add(name)
        self.workers[name].kill(how)
        if replace_now:
            self.add_worker()
        else:
            self.restore = self.add_worker
        return f"worker {name} {how.name}"

    async def kill_replica(
        self, rng: random.Random, how: signal.Signals, restart_now: bool = True
    ) -> str:
        """Stop a replica; it restarts on its port at once, or (`restart_now=False`) once the
        fault has been measured: a Python process starting takes this 2-core machine's CPU
        for a second, which would stall every stream and be counted against the fault."""
        i = rng.randrange(2)
        old = self.replicas[i]
        old.kill(how)
        await asyncio.get_running_loop().run_in_executor(None, old.process.wait, 20)

        def restart() -> None:
            self.replicas[i] = start_signaling(old.name, self.redis.url, self.log_dir,
                                               *REPLICA_OPTIONS, port=old.port)  # fmt: skip

        if restart_now:
            restart()
        else:
            self.restore = restart
        return f"{old.name} {how.name}"

    async def redis_outage(self, seconds: float, pause: bool = False) -> str:
        if pause:
            self.redis.pause()
        else:
            self.redis.stop()
        await asyncio.sleep(seconds)
        if pause:
            self.redis.resume()
        else:
            self.redis.start()
        return f"redis {'paused' if pause else 'stopped'} {seconds:g}s"

    async def drop_queued(self, rng: random.Random) -> str:
        waiting = [v for v in self.arrivals if v.queued and not v.gone]
        if not waiting:
            return "no queued page to drop"
        victim = rng.choice(waiting)
        await victim.drop()
        return f"queued {victim.name} vanished"

    async def end_one(self, rng: random.Random) -> str:
        streaming = [v for v in self.live_pages() if v.streaming()]
        victim = rng.choice(streaming)
        await victim.close()
        return f"{victim.name} ended its session"

    # -- one step -----------------------------------------------------------------------------

    async def apply(self, name: str, fault: Callable[[], Awaitable[str]]) -> Outcome:
        at = time.monotonic()
        what = await fault()
        outcome = Outcome(f"{name}: {what}", at)
        await asyncio.sleep(MIN_SETTLE_S)  # time for the fault to show (a page's last frames)
        deadline = time.monotonic() + SETTLE_S
        calm_since = None  # settled without a break for STEADY_S, not by chance
        while time.monotonic() < deadline:
            if not self.settled():
                calm_since = None
            elif calm_since is None:
                calm_since = time.monotonic()
            elif time.monotonic() - calm_since >= STEADY_S:
                break
            await asyncio.sleep(0.2)
        now = time.monotonic()
        for v in self.live_pages():
            gap = v.longest_gap(max(at, v.frames[0] if v.frames else at), now) if v.frames else 0
            outcome.longest_gap_s = max(outcome.longest_gap_s, gap)
            if gap > GAP_S:
                first = next((f for f in v.frames if f > at and f - _before(v, f) > GAP_S), None)
                outcome.recovered_s[v.name] = (first or now) - at
        outcome.problems = self.problems()
        if self.restore is not None:
            self.restore()
            self.restore = None
            await asyncio.sleep(RESTORE_S)  # the restarted process's start-up CPU, not measured
        return outcome

    def problems(self) -> list[str]:
        found = []
        pages = self.live_pages()
        for v in pages:
            if not (v.queued or v.streaming()):
                found.append(f"{v.name} neither streams nor waits ({v._story()})")
        for v in self.pages:
            if v.ended.done() and not v.gone:
                found.append(f"{v.name} ended: {v.ended.result()}")
        fleet = self.registered()
        used = sum(int(w["slots"]) - int(w["free"]) for w in fleet)  # type: ignore[call-overload]
        streaming = sum(1 for v in pages if v.streaming())
        if used != streaming:
            found.append(f"{used} slots used for {streaming} sessions streaming")
        # served in order: of the pages that were queued, those served are a prefix
        order = [v for v in self.arrivals if not v.gone]
        served = [not v.queued for v in order]
        if served != sorted(served, reverse=True):
            states = [(v.name, s) for v, s in zip(order, served, strict=True)]
            found.append(f"queue served out of order: {states}")
        return found


Fault = Callable[[], Awaitable[str]]


def faults(
    fleet: ChaosFleet, rng: random.Random, outage_s: float = 10.0, restart_now: bool = True
) -> dict[str, Fault]:
    """Every kind of fault, by name; `restart_now=False`: the replacement worker and the
    restarted replica start once the fault is measured (see `kill_worker`, `kill_replica`)."""
    return {
        "worker-kill": lambda: fleet.kill_worker(rng, signal.SIGKILL, restart_now),
        "worker-sigterm": lambda: fleet.kill_worker(rng, signal.SIGTERM, restart_now),
        "worker-freeze": lambda: fleet.kill_worker(rng, signal.SIGSTOP, restart_now),
        "replica-kill": lambda: fleet.kill_replica(rng, signal.SIGKILL, restart_now),
        "replica-sigterm": lambda: fleet.kill_replica(rng, signal.SIGTERM, restart_now),
        "redis-stop": lambda: fleet.redis_outage(outage_s),
        "redis-pause": lambda: fleet.redis_outage(outage_s, pause=True),
        "queued-page-vanishes": lambda: fleet.drop_queued(rng),
        "page-ends-session": lambda: fleet.end_one(rng),
    }


def _before(viewer: FollowingViewer, frame: float) -> float:
    i = viewer.frames.index(frame)
    return viewer.frames[i - 1] if i > 0 else frame


async def until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.1)
