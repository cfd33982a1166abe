"""Claims per second and request/release latency: MemoryRegistry against RedisRegistry.

    python benchmarks/registry.py [--sessions 1000] [--workers 50] [--slots 10] [--rounds 5]
                                  [--redis-url redis://...]

`--sessions` browsers run at once, each `--rounds` times: request a slot (waiting in the queue
when none is free), hold it for a moment, release it; a release that serves a waiting session
hands it its claim. 50 workers of 10 slots give 500 slots to 1,000 sessions, so half of them
wait and every release serves the queue. Figures: the claims made and the seconds the run took
(so claims per second over the whole run), and the p50/p99 (`tools.stats.percentile`) latency
of one `request` call, one `release` call, and of the two. Then the same with one browser at a
time: the latency of a call with nothing else going on.

The Redis registry runs with one instance (in this process) and with two signaling replicas as
two processes sharing the queue: a release in one replica may serve a session of the other,
which learns it through the bus, as the replicas do. Ratios are against MemoryRegistry measured
in the same run. Without `--redis-url` a redis-server is started for the run (Debian's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from render_server.protocol.requirements import Requirements  # noqa: E402
from render_server.signaling.state.bus import Message, RedisBus  # noqa: E402
from render_server.signaling.state.redis import connect_redis  # noqa: E402
from render_server.signaling.state.redis_registry import RedisRegistry  # noqa: E402
from render_server.signaling.state.registry import (  # noqa: E402
    Claim,
    MemoryRegistry,
    Registry,
    WorkerInfo,
)
from render_server.tools.stats import percentile  # noqa: E402


@dataclass
class Figures:
    claims: int = 0
    seconds: float = 0.0
    request_ms: list[float] = field(default_factory=list)
    release_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.claims / self.seconds

    def add(self, other: Figures) -> None:
        self.claims += other.claims
        self.seconds = max(self.seconds, other.seconds)
        self.request_ms += other.request_ms
        self.release_ms += other.release_ms
        self.pair_ms += other.pair_ms


async def register_workers(registry: Registry, workers: int, slots: int) -> None:
    for w in range(workers):
        await registry.register(WorkerInfo(f"worker-{w:03d}", slots, {"codecs": ["H264"]}))


class Browsers:
    """Sessions of one replica: request, hold a moment, release, `rounds` times each."""

    def __init__(self, registry: Registry, replica: int = 0) -> None:
        self.registry = registry
        self.replica = replica
        self.figures = Figures()
        self.waiting: dict[str, asyncio.Future[Claim]] = {}
        self.bus: RedisBus | None = None  # to tell the other replica's sessions

    def served(self, claim: Claim) -> None:
        # may come before request() has returned to the browser: the future is already there
        self.waiting.pop(claim.session_id).set_result(claim)

    async def hand_over(self, served: list[Claim]) -> None:
        for claim in served:
            self.figures.claims += 1
            owner = int(claim.session_id.split("-")[0][1:])
            if owner == self.replica:
                self.served(claim)
            else:
                assert self.bus is not None
                message = {"worker_id": claim.worker_id, "session_id": claim.session_id}
                await self.bus.publish(f"replica-{owner}", message)

    async def on_message(self, message: Message) -> None:
        self.served(Claim(message["worker_id"], message["session_id"]))

    async def browser(self, n: int, rounds: int) -> None:
        loop = asyncio.get_running_loop()
        for r in range(rounds):
            session = f"r{self.replica}-s{n}-{r}"
            served_later = self.waiting[session] = loop.create_future()
            t0 = time.perf_counter()
            ticket = await self.registry.request(session, Requirements())
            request_s = time.perf_counter() - t0
            if ticket.claim is not None:
                self.figures.claims += 1
                del self.waiting[session]
                claim = ticket.claim
            else:
                claim = await served_later
            await asyncio.sleep(0)  # the session runs
            t0 = time.perf_counter()
            served = await self.registry.release(claim)
            release_s = time.perf_counter() - t0
            await self.hand_over(served)
            self.figures.request_ms.append(request_s * 1e3)
            self.figures.release_ms.append(release_s * 1e3)
            self.figures.pair_ms.append((request_s + release_s) * 1e3)

    async def run(self, sessions: range, rounds: int) -> Figures:
        t0 = time.perf_counter()
        await asyncio.gather(*(self.browser(n, rounds) for n in sessions))
        self.figures.seconds = time.perf_counter() - t0
        assert not self.waiting
        return self.figures


async def one_process(registry: Registry, sessions: int, rounds: int) -> Figures:
    figures = await Browsers(registry).run(range(sessions), rounds)
    assert await registry.queue() == []
    return figures


async def replica(
    url: str, prefix: str, index: int, replicas: int, sessions: int, rounds: int
) -> Figures:
    registry = await RedisRegistry.connect(url, prefix)
    browsers = Browsers(registry, index)
    browsers.bus = RedisBus(url, prefix)
    await browsers.bus.subscribe(f"replica-{index}", browsers.on_message)
    ready = await connect_redis(url, "the start barrier")
    await ready.incr(f"{prefix}:ready")
    while int(await ready.get(f"{prefix}:ready") or 0) < replicas:  # start together
        await asyncio.sleep(0.001)
    await ready.aclose()
    figures = await browsers.run(range(index, sessions, replicas), rounds)
    await browsers.bus.close()
    await registry.close()
    return figures


def replica_process(*args: object) -> Figures:
    return asyncio.run(replica(*args))  # type: ignore[arg-type]


async def replicas(
    url: str, count: int, workers: int, slots: int, sessions: int, rounds: int
) -> Figures:
    prefix = f"bench{time.time_ns()}"
    setup = await RedisRegistry.connect(url, prefix)
    await register_workers(setup, workers, slots)
    context = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(count, mp_context=context) as pool:
        parts = await asyncio.gather(
            *(
                loop.run_in_executor(pool, replica_process, url, prefix, i, count, sessions, rounds)
                for i in range(count)
            )
        )
    assert await setup.queue() == []
    await setup.close()
    total = Figures()
    for part in parts:
        total.add(part)
    return total


@contextlib.contextmanager
def redis_for_the_run(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    from tests.redis_server import redis_server

    with redis_server() as started:
        yield started


async def server_side(url: str) -> str:
    """What Redis itself spent per script call (the rest is the client and the waiting)."""
    client = await connect_redis(url, "Redis's own figures")
    try:
        stats = await client.info("commandstats")
        await client.config_resetstat()
    finally:
        await client.aclose()
    evalsha = stats.get("cmdstat_evalsha", {})
    return (
        f"in Redis: {evalsha.get('calls', 0):,} scripts run, "
        f"{evalsha.get('usec_per_call', 0.0):.1f} µs each on average"
    )


def line(name: str, f: Figures, base: Figures | None) -> str:
    def p(values: list[float]) -> str:
        return f"p50 {percentile(values, 50):7.3f} p99 {percentile(values, 99):8.3f}"

    text = (
        f"  {name:<20} {f.claims:>6,} claims in {f.seconds:6.2f} s = {f.per_second:>9,.0f}/s   "
        f"request {p(f.request_ms)} ms   release {p(f.release_ms)} ms   both {p(f.pair_ms)} ms"
    )
    if base is not None:
        p50 = percentile(f.pair_ms, 50) / percentile(base.pair_ms, 50)
        p99 = percentile(f.pair_ms, 99) / percentile(base.pair_ms, 99)
        text += (
            f"\n  {'':<20} Redis/memory: claims/s x{f.per_second / base.per_second:.3f}, "
            f"latency p50 x{p50:.0f}, p99 x{p99:.0f}"
        )
    return text


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0], epilog=(__doc__ or "").split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=50)
    parser.add_argument("--slots", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    workers, slots = args.workers, args.slots
    with redis_for_the_run(args.redis_url) as url:
        for sessions, rounds in ((args.sessions, args.rounds), (1, 2000)):
            print(
                f"{sessions} session{'s' if sessions > 1 else ''} at once x {rounds} rounds, "
                f"{workers} workers of {slots} slots"
            )
            memory = MemoryRegistry()
            await register_workers(memory, workers, slots)
            base = await one_process(memory, sessions, rounds)
            print(line("memory", base, None))
            shared = await RedisRegistry.connect(url, f"bench{time.time_ns()}")
            await register_workers(shared, workers, slots)
            await server_side(url)  # resets the counts
            figures = await one_process(shared, sessions, rounds)
            await shared.close()
            print(line("redis, 1 instance", figures, base))
            print(f"  {'':<20} {await server_side(url)}")
            if sessions > 1:
                figures = await replicas(url, 2, workers, slots, sessions, rounds)
                print(line("redis, 2 processes", figures, base))
                print(f"  {'':<20} {await server_side(url)}")


if __name__ == "__main__":
    asyncio.run(main())
