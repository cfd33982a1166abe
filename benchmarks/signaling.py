"""How fast the signaling tier places sessions, and what an idle socket costs.

    python benchmarks/signaling.py [--clients 1000] [--workers 50]

Real `render-server signaling` processes (tokens on), fake workers that open sessions at once
(no rendering: this measures placement), and --clients browsers' signaling sockets opened at
the same time, each sending session.start and waiting for session.started. Two setups in the
same run: one replica with the in-memory registry (the baseline), and two replicas sharing a
real redis-server (clients and workers split between them). Prints, for both, the sessions
placed, the seconds it took and so sessions placed per second, p50/p99 (`tools.stats`) from
request to session.started, and the ratio of the Redis setup to the baseline; then the resident
memory one idle WebSocket costs a replica (VmRSS before and after opening --clients sockets).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from render_server.tools.stats import percentile  # noqa: E402
from tests.fake_worker import FakeWorker  # noqa: E402
from tests.processes import (  # noqa: E402
    Process,
    SignalClient,
    start_signaling,
    stopping,
    token,
)
from tests.redis_server import redis_server  # noqa: E402


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def place(replicas: list[Process], clients: int, workers: int) -> dict[str, float]:
    slots = -(-clients // workers)
    fakes = [
        FakeWorker(
            f"ws://127.0.0.1:{replicas[i % len(replicas)].port}/worker",
            f"fake-{i}",
            slots,
            token=token("worker", f"fake-{i}"),
        )  # fmt: skip
        for i in range(workers)
    ]
    await asyncio.gather(*(f.start() for f in fakes))
    browsers = [
        SignalClient(replicas[i % len(replicas)].ws, token("controller", f"user-{i}"))
        for i in range(clients)
    ]
    for chunk in range(0, clients, 100):  # don't trip the kernel's accept backlog
        await asyncio.gather(*(b.connect() for b in browsers[chunk : chunk + 100]))

    async def one(browser: SignalClient) -> float:
        t0 = time.perf_counter()
        await browser.send(type="session.start")
        await browser.next("session.started", timeout=120)
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    latencies = await asyncio.gather(*(one(b) for b in browsers))
    wall = time.perf_counter() - t0
    opened = sum(len(f.opened) for f in fakes)
    assert opened == clients, f"{opened} sessions opened for {clients} clients"
    await asyncio.gather(*(b.close() for b in browsers))
    await asyncio.gather(*(f.stop() for f in fakes))
    return {
        "per_s": clients / wall,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "wall_s": wall,
    }


async def idle_socket_cost(replica: Process, sockets: int) -> float:
    before = rss_kib(replica.process.pid)
    browsers = [SignalClient(replica.ws, token("controller", f"idle-{i}")) for i in range(sockets)]
    for chunk in range(0, sockets, 100):
        await asyncio.gather(*(b.connect() for b in browsers[chunk : chunk + 100]))
    await asyncio.sleep(1.0)
    after = rss_kib(replica.process.pid)
    await asyncio.gather(*(b.close() for b in browsers))
    return (after - before) / sockets


def report(name: str, figures: dict[str, float], clients: int) -> None:
    print(
        f"  {name:<32} {clients} sessions in {figures['wall_s']:.2f} s = "
        f"{figures['per_s']:8.0f} sessions/s   p50 {figures['p50_ms']:7.1f} ms"
        f"   p99 {figures['p99_ms']:7.1f} ms"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=50)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-signaling-"))
    print(f"{args.clients} concurrent browsers, {args.workers} fake workers (logs in {logs})")

    fresh = start_signaling("idle", None, logs)  # a replica that has served nothing yet
    with stopping(fresh):
        idle = await idle_socket_cost(fresh, args.clients)
    one = start_signaling("memory", None, logs)
    with stopping(one):
        memory = await place([one], args.clients, args.workers)
    with redis_server() as url:
        r1 = start_signaling("redis-1", url, logs)
        r2 = start_signaling("redis-2", url, logs)
        with stopping(r1, r2):
            shared = await place([r1, r2], args.clients, args.workers)
    report("one replica, in-memory registry", memory, args.clients)
    report("two replicas on Redis", shared, args.clients)
    print(
        f"  Redis / memory: {shared['per_s'] / memory['per_s']:.2f}x the sessions per second, "
        f"{shared['p50_ms'] / memory['p50_ms']:.2f}x the median wait"
    )
    print(f"  memory per idle WebSocket: {idle:.1f} KiB (resident, {args.clients} sockets)")
    print("  (clients, fake workers and replicas share this machine's cores)")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
