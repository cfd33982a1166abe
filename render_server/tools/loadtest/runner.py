"""Runs a load test: streams spread over processes, a shared clock, progress, the server's counts.

Receiving is CPU work (SRTP, RTP parsing, aiortc's NACK and jitter bookkeeping), so one asyncio
loop cannot hold many 4K streams: the streams are dealt round-robin to `processes` spawned
processes, each with a loop of its own. All of them wait until every one has imported and
then start on one shared origin (`time.monotonic()` is one clock for the whole host), so the
ramp is even across processes and the per-second series line up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import queue
import resource
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from render_server.memory import settle_heap, size_datagram_reads
from render_server.protocol.timing import now_ms
from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.result import StreamResult
from render_server.tools.loadtest.server import ServerApi, worker_mode
from render_server.tools.loadtest.stream import END_WAIT_S, StreamProbe
from render_server.tools.loadtest.wakes import loop_factory
from render_server.tools.stats import percentile

PROGRESS_INTERVAL_S = 1.0
START_TIMEOUT_S = 120.0  # for the processes to import aiortc and PyAV and say they are ready
START_LEAD_S = 0.3
HOLD_SETTLE_S = 1.0  # the CPU meter starts this long after the ramp (handshakes done)


@dataclass
class StreamStatus:
    index: int
    state: str = "pending"
    session_id: str | None = None
    frames: int = 0
    bytes: int = 0
    reason: str | None = None


@dataclass
class Progress:
    """The run as the display (and a test's hook) sees it, about once a second."""

    elapsed_s: float
    phase: str  # starting, ramp, hold, closing
    streams: list[StreamStatus]
    fps: float  # all streams, over the last interval
    mbps: float
    p95_ms: float | None  # frame latency over the last few seconds, all streams

    def count(self, *states: str) -> int:
        return sum(1 for s in self.streams if s.state in states)


@dataclass
class RunResult:
    config: LoadTestConfig
    mode: dict[str, Any]
    streams: list[StreamResult]
    started_at: float  # wall clock (time.time()) of the origin
    wall_s: float
    server_before: dict[str, float]
    server_after: dict[str, float] | None
    server_error: str | None
    processes: list[dict[str, Any]] = field(default_factory=list)  # per process: CPU seconds


class HarnessError(RuntimeError):
    """The harness itself could not run (a process would not start)."""


def _deal(streams: int, processes: int) -> list[list[int]]:
    """Round-robin, so that each process's streams are spread over the whole ramp."""
    processes = min(processes, streams)
    return [list(range(p, streams, processes)) for p in range(processes)]


def run_loadtest(
    config: LoadTestConfig, on_progress: Callable[[Progress], None] | None = None
) -> RunResult:
    """Run the whole test; raises `ServerUnreachable` before starting anything when the server
    does not answer, `HarnessError` when a process cannot start."""
    api = ServerApi(config.server, config.token)
    mode = worker_mode(api.workers())
    before = api.metrics()
    shares = _deal(config.streams, config.processes)
    context = mp.get_context("spawn")
    messages: Any = context.Queue()
    go = context.Event()
    origin = context.Value("d", 0.0)
    children = [
        context.Process(
            target=_child_main,
            args=(config, p, indices, messages, go, origin),
            name=f"loadtest-{p}",
            daemon=True,
        )
        for p, indices in enumerate(shares)
    ]
    for child in children:
        child.start()
    status = {i: StreamStatus(i) for i in range(config.streams)}
    results: dict[int, StreamResult] = {}
    process_info: dict[int, dict[str, Any]] = {}
    try:
        ready: set[int] = set()
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(ready) < len(children):
            _check_alive(children, ready)
            if time.monotonic() > deadline:
                raise HarnessError(f"harness processes not ready in {START_TIMEOUT_S:g} s")
            with contextlib.suppress(queue.Empty):
                message = messages.get(timeout=0.2)
                if message[0] == "ready":
                    ready.add(message[1])
        t0_ms = now_ms() + START_LEAD_S * 1000.0
        started_at = time.time() + START_LEAD_S
        origin.value = t0_ms
        go.set()
        _watch(config, children, messages, status, results, process_info, t0_ms, on_progress)
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
    wall_s = (now_ms() - t0_ms) / 1000.0
    for i in range(config.streams):  # a process that died took its streams with it
        if i not in results:
            lost = StreamResult(i, -1, state="failed", reason="its harness process died")
            results[i] = lost
    after: dict[str, float] | None = None
    error = None
    try:
        after = api.metrics()
    except ConnectionError as exc:
        error = str(exc)
    return RunResult(
        config, mode, [results[i] for i in sorted(results)], started_at, wall_s, before, after,
        error, [process_info[p] for p in sorted(process_info)],
    )  # fmt: skip


def _check_alive(children: list[Any], ready: set[int]) -> None:
    for p, child in enumerate(children):
        if p not in ready and not child.is_alive():
            raise HarnessError(f"harness process {p} exited with {child.exitcode} at start")


def _watch(
    config: LoadTestConfig,
    children: list[Any],
    messages: Any,
    status: dict[int, StreamStatus],
    results: dict[int, StreamResult],
    process_info: dict[int, dict[str, Any]],
    t0_ms: float,
    on_progress: Callable[[Progress], None] | None,
) -> None:
    """Gather progress and results until every process has reported (or died)."""
    done: set[int] = set()
    recent: deque[tuple[float, list[float]]] = deque()
    last_frames = last_bytes = 0
    last_tick = now_ms()
    limit_ms = t0_ms + (config.end_s + config.setup_timeout_s + END_WAIT_S + 60.0) * 1000.0
    while len(done) < len(children):
        try:
            message = messages.get(timeout=0.1)
        except queue.Empty:
            message = None
        if message is not None:
            kind, p = message[0], message[1]
            if kind == "progress":
                for s in message[2]:
                    status[s.index] = s
                recent.append((now_ms(), message[3]))
            elif kind == "done":
                done.add(p)
                for result in message[2]:
                    results[result.index] = result
                process_info[p] = message[3]
        for p, child in enumerate(children):
            if p not in done and not child.is_alive() and messages.empty():
                done.add(p)
                process_info[p] = {"process": p, "exitcode": child.exitcode, "died": True}
        now = now_ms()
        if now > limit_ms:
            raise HarnessError("the harness processes did not finish in time")
        if now - last_tick >= PROGRESS_INTERVAL_S * 1000.0 and on_progress is not None:
            frames = sum(s.frames for s in status.values())
            sent = sum(s.bytes for s in status.values())
            dt = (now - last_tick) / 1000.0
            while recent and recent[0][0] < now - 3000.0:
                recent.popleft()
            latencies = [x for _, batch in recent for x in batch]
            elapsed = (now - t0_ms) / 1000.0
            phase = (
                "starting" if elapsed < 0
                else "ramp" if elapsed < config.ramp_s
                else "hold" if elapsed < config.end_s
                else "closing"
            )  # fmt: skip
            on_progress(
                Progress(
                    elapsed, phase, [status[i] for i in sorted(status)],
                    (frames - last_frames) / dt, (sent - last_bytes) * 8 / dt / 1e6,
                    percentile(latencies, 95) if latencies else None,
                )
            )  # fmt: skip
            last_frames, last_bytes, last_tick = frames, sent, now


def _child_main(
    config: LoadTestConfig,
    process: int,
    indices: list[int],
    messages: Any,
    go: Any,
    origin: Any,
) -> None:
    """A harness process: its share of the streams on an asyncio loop of its own."""
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiortc", "aioice", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # a full collection over what aiortc and PyAV left at import would stall every stream of
    # this process for tens of ms (counted as a freeze): none of it is garbage
    settle_heap()
    size_datagram_reads()  # the clients' RTCP, SCTP and ICE reads (media comes through udp_gro)
    messages.put(("ready", process))
    go.wait()
    t0_ms = float(origin.value)
    window: dict[str, float] = {}
    with asyncio.Runner(loop_factory=loop_factory(config.wake_interval_s)) as runner:
        results = runner.run(_run_share(config, process, indices, messages, t0_ms, window))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    info = {
        "process": process,
        "pid": os.getpid(),
        "streams": len(indices),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "wall_s": round((now_ms() - t0_ms) / 1000.0, 2),
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "hold_window": window,
    }
    messages.put(("done", process, results, info))


async def _run_share(
    config: LoadTestConfig,
    process: int,
    indices: list[int],
    messages: Any,
    t0_ms: float,
    window: dict[str, float],
) -> list[StreamResult]:
    probes = [StreamProbe(config, i, process, t0_ms) for i in indices]
    tasks = [asyncio.create_task(probe.run()) for probe in probes]
    reporter = asyncio.create_task(_report_progress(probes, process, messages))
    meter = asyncio.create_task(_measure_hold(config, probes, t0_ms, window))
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        reporter.cancel()
        meter.cancel()


async def _measure_hold(
    config: LoadTestConfig, probes: list[StreamProbe], t0_ms: float, window: dict[str, float]
) -> None:
    """This process's CPU time and RTP packets over the hold, a second after the ramp to the
    end: what receiving costs, without imports, handshakes or teardown. The window's ends are
    `now_ms` readings (the host's monotonic clock), for a server's CPU over the same window."""
    start_s = min(config.hold_start_s + HOLD_SETTLE_S, config.end_s)

    def sample() -> tuple[float, float, int]:
        packets = sum(p.packets for p in probes)
        return now_ms(), time.process_time(), packets

    await asyncio.sleep(max(0.0, (t0_ms + start_s * 1000.0 - now_ms()) / 1000.0))
    ms0, cpu0, packets0 = sample()
    await asyncio.sleep(max(0.0, (t0_ms + config.end_s * 1000.0 - now_ms()) / 1000.0))
    ms1, cpu1, packets1 = sample()
    window.update(seconds=round((ms1 - ms0) / 1000.0, 3), cpu_s=round(cpu1 - cpu0, 3),
                  packets=packets1 - packets0, start_ms=round(ms0, 1),
                  end_ms=round(ms1, 1))  # fmt: skip


async def _report_progress(probes: list[StreamProbe], process: int, messages: Any) -> None:
    while True:
        await asyncio.sleep(PROGRESS_INTERVAL_S)
        statuses = [
            StreamStatus(
                p.result.index,
                p.result.state,
                p.result.session_id,
                p.result.frames,
                p.result.bytes,
                p.result.reason,
            )  # fmt: skip
            for p in probes
        ]
        latencies = [x for p in probes for x in p.latency.take_recent()]
        messages.put(("progress", process, statuses, latencies))
