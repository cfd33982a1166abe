"""What a viewer of a shared session costs the worker, against a session of its own.

    python benchmarks/sharing.py [--viewers 3] [--runs 2] [--seconds 8]
        [--resolution 640x360] [--fps 30] [--warmup 2] [--json]

A signaling server (`render-server signaling`) and one worker (`render-server worker`: the CPU
renderer and libx264, `--animate` so that the camera moves and every tick is a new frame, as
many slots as pages), each a child process; the pages are real aiortc peers in this process,
opened through the signaling socket as a browser opens them (an owner: `session.start` and an
offer; a viewer: the owner's `session.share`, then `session.watch` and an offer on a socket of
its own), each receiving on the lean receive path (RTP read from the decrypted datagram,
frames counted complete on the marker bit: `transport/lean_receiver.py`, the load test's).
Two sides, in turns (shared, separate, shared, separate ... `--runs` of each), each with
`--viewers` + 1 pages:

- shared: one owner session and `--viewers` viewers of it (one render and one encode a frame,
  the same packets sent to every page);
- separate: `--viewers` + 1 sessions, each with its own owner (a render and an encode each).

Once every page has a frame, plus `--warmup` seconds, a window of `--seconds` opens: the worker
process's CPU time (utime + stime from /proc/<pid>/stat), each page's complete frames and the
worker's `/metrics` (`worker_frames_encoded_total`, `worker_viewer_frames_total`) are read at
its start and its end. Printed per run and per side (the runs summed): pages that got frames
in the window, frames per page (min / median), fps per page, the worker's CPU seconds and
cores, its CPU-ms per frame delivered (all pages together), the frames it encoded; then the
ratios separate / shared of the worker's CPU and of its CPU per delivered frame, and, taking
the worker's CPU as linear in frames, what a frame sent to a viewer costs it against a frame of
a session of its own (the shared side's CPU beyond its owner's frames, at the separate side's
price a frame, over its viewers' frames). The separate side's fps may fall short on a small
machine: the CPU per delivered frame is then the figure to compare. `--json` prints the same
as one JSON document instead; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
from render_server.cpu_time import process_cpu_seconds_or_raise  # noqa: E402
from render_server.signaling.auth import Authenticator  # noqa: E402
from render_server.tools.local_server import free_port  # noqa: E402
from render_server.tools.measure.frames import FrameAssembler, ObservedFrame  # noqa: E402
from render_server.tools.signaling_client import SignalingClient  # noqa: E402
from render_server.transport.lean_receiver import LeanReceiver  # noqa: E402

SIDES = ("shared", "separate")
COUNTERS = {  # what is read of the worker's /metrics: sample name (labels summed)
    "encoded": "worker_frames_encoded_total",
    "viewer_sent": 'worker_viewer_frames_total{outcome="sent"}',
    "viewer_dropped": 'worker_viewer_frames_total{outcome="dropped"}',
    "sessions": "render_worker_sessions",
    "viewers": "worker_viewers",
}
FIRST_FRAME_S = 60.0  # every page has a frame within this, or the run fails
IDLE_S = 30.0  # after a run, the worker is back to no session within this


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- the processes -------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    command: list[str]

    def tail(self) -> str:
        return self.log_path.read_text()[-3000:] if self.log_path.exists() else ""


def spawn(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Child:
    command = [sys.executable, "-m", "render_server", *args]
    log_path = log_dir / f"{name}.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return Child(name, process, log_path, command)


def wait_until_up(child: Child, url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited: {child.tail()}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=1):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} not up in {timeout:.0f} s: {child.tail()}")
        time.sleep(0.2)


def stop(children: list[Child]) -> None:
    """The last started first (the worker before its signaling server, so that it does not
    see its server go and reconnect)."""
    for child in reversed(children):
        if child.process.poll() is None:
            child.process.terminate()
        try:
            child.process.wait(15)
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def read_metrics(port: int) -> dict[str, float]:
    """The worker's counters of COUNTERS, from its status port's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        name = sample.split("{", 1)[0]
        for key, wanted in COUNTERS.items():
            wanted_name, _, wanted_label = wanted.partition("{")
            if name == wanted_name and (not wanted_label or wanted_label[:-1] in sample):
                found[key] += float(value)
    return found


# -- the pages -----------------------------------------------------------------------------------


class Page:
    """A page's peer connection (recvonly video and the `input` channel), its complete frames
    counted on the marker bit by a lean receiver: little CPU on this side."""

    def __init__(self, client: SignalingClient, role: str) -> None:
        self.client = client
        self.role = role
        self.complete = 0
        self.assembler = FrameAssembler(self._on_frame)
        self.messages: list[dict[str, Any]] = []  # on the owner's socket: share answers
        self.pc: Any = None

    def _on_frame(self, frame: ObservedFrame, unit: bytes) -> None:
        if frame.complete:
            self.complete += 1

    async def negotiate(self) -> None:
        # no transport-cc feedback, as the load test's receivers (tools/loadtest/stream.py):
        # arrival times stamped on a loaded machine would read as congestion; no REMB either
        # (the lean path sends none): the worker's rate is its own
        self.pc, receiver, _ = self.client.viewer_peer(
            lambda data: None, lambda: None, transport_feedback=False
        )
        lean = LeanReceiver(receiver, self.assembler.add, self.assembler.set_codec)
        await self.client.negotiate(self.pc, timeout=30)
        lean.rehook()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.end(5.0 if self.role == "owner" else None)
        with contextlib.suppress(Exception):
            if self.pc is not None:
                await self.pc.close()
        with contextlib.suppress(Exception):
            await self.client.close()


async def open_owner(url: str, auth: Authenticator, n: int) -> Page:
    messages: list[dict[str, Any]] = []
    client = SignalingClient(url, auth.mint("controller", f"owner-{n}"), messages.append)
    page = Page(client, "owner")
    page.messages = messages
    await client.start(timeout=30)
    await page.negotiate()
    return page


async def share(owner: Page, timeout: float = 15.0) -> str:
    """The owner's `session.share`: the viewers' link token."""
    await owner.client.send({"type": "session.share", "ttlS": 3600})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for message in owner.messages:
            if message.get("type") == "session.shared":
                return str(message["token"])
            if message.get("type") == "error":
                raise RuntimeError(f"session.share refused: {message}")
        await asyncio.sleep(0.05)
    raise TimeoutError("no session.shared")


async def open_viewer(url: str, link: str, n: int) -> Page:
    client = SignalingClient(url, link)
    page = Page(client, "viewer")
    await client.watch(link, f"viewer {n}", timeout=30)
    await page.negotiate()
    return page


# -- one side, one run ---------------------------------------------------------------------------


@dataclass
class Window:
    side: str
    run: int
    pages: int  # pages opened
    seconds: float
    cpu_s: float  # the worker process's CPU time over the window
    frames: list[int]  # complete frames each page got in the window
    counters: dict[str, float] = field(default_factory=dict)  # /metrics deltas
    harness_cpu_s: float = 0.0  # this process's (the receivers') CPU time, for scale
    signaling_cpu_s: float = 0.0

    @property
    def delivered(self) -> int:
        return sum(self.frames)

    @property
    def streams(self) -> int:
        return sum(1 for f in self.frames if f > 0)

    @property
    def ms_per_frame(self) -> float:
        return self.cpu_s * 1e3 / self.delivered if self.delivered else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "streams": self.streams,
            "delivered": self.delivered,
            "frames_min": min(self.frames),
            "frames_median": statistics.median(self.frames),
            "fps_min": min(self.frames) / self.seconds,
            "fps_median": statistics.median(self.frames) / self.seconds,
            "cores": self.cpu_s / self.seconds,
            "cpu_ms_per_frame": self.ms_per_frame,
        }


@dataclass
class Setup:
    url: str  # the signaling server's http URL
    auth: Authenticator
    worker_pid: int
    signaling_pid: int
    metrics_port: int
    viewers: int
    seconds: float
    warmup: float


async def run_side(setup: Setup, side: str, run: int) -> Window:
    pages: list[Page] = []
    try:
        if side == "shared":
            owner = await open_owner(setup.url, setup.auth, 0)
            pages.append(owner)
            link = await share(owner)
            for n in range(setup.viewers):
                pages.append(await open_viewer(setup.url, link, n))
        else:
            for n in range(setup.viewers + 1):
                pages.append(await open_owner(setup.url, setup.auth, n))
        deadline = time.monotonic() + FIRST_FRAME_S
        while not all(p.complete for p in pages):
            ended = [p.client.errors for p in pages if p.client.errors]
            if ended or time.monotonic() > deadline:
                got = [p.complete for p in pages]
                raise RuntimeError(f"{side}: not every page got a frame ({got}; {ended})")
            await asyncio.sleep(0.1)
        await asyncio.sleep(setup.warmup)

        async def sample() -> tuple[list[int], float, float, float, float, dict[str, float]]:
            frames = [p.complete for p in pages]
            t = time.monotonic()
            cpu = process_cpu_seconds_or_raise(setup.worker_pid)
            harness = time.process_time()
            signaling = process_cpu_seconds_or_raise(setup.signaling_pid)
            counters = await asyncio.to_thread(read_metrics, setup.metrics_port)
            return frames, t, cpu, harness, signaling, counters

        f0, t0, c0, h0, s0, m0 = await sample()
        await asyncio.sleep(setup.seconds)
        f1, t1, c1, h1, s1, m1 = await sample()
        lost = [p.client.errors for p in pages if p.client.errors]
        if lost:
            log(f"  {side}: errors during the window: {lost}")
        return Window(
            side, run, len(pages), t1 - t0, c1 - c0, [b - a for a, b in zip(f0, f1, strict=True)],
            {k: m1[k] - m0[k] for k in ("encoded", "viewer_sent", "viewer_dropped")},
            h1 - h0, s1 - s0,
        )  # fmt: skip
    finally:
        for page in reversed(pages):  # the viewers first, the owners after
            await page.close()
        await wait_idle(setup.metrics_port)


async def wait_idle(port: int) -> None:
    """Until the worker holds no session and no viewer: the next run starts from nothing."""
    deadline = time.monotonic() + IDLE_S
    while True:
        counters = await asyncio.to_thread(read_metrics, port)
        if counters["sessions"] == 0 and counters["viewers"] == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker still holds sessions after {IDLE_S:.0f} s: {counters}")
        await asyncio.sleep(0.2)


async def run_all(setup: Setup, runs: int) -> list[Window]:
    windows = []
    for run in range(1, runs + 1):
        for side in SIDES:
            window = await run_side(setup, side, run)
            s = window.summary()
            log(
                f"run {run} {side:>8}: {window.streams}/{window.pages} pages, frames/page min "
                f"{s['frames_min']} median {s['frames_median']:g}, worker {window.cpu_s:.2f} "
                f"CPU-s, {window.ms_per_frame:.2f} CPU-ms/frame, "
                f"{window.counters['encoded']:.0f} encoded"
            )
            windows.append(window)
    return windows


# -- the report ----------------------------------------------------------------------------------


def totals(windows: list[Window], side: str) -> dict[str, Any]:
    mine = [w for w in windows if w.side == side]
    seconds = sum(w.seconds for w in mine)
    cpu = sum(w.cpu_s for w in mine)
    per_page_fps = [f / w.seconds for w in mine for f in w.frames]
    delivered = sum(w.delivered for w in mine)
    return {
        "side": side,
        "runs": len(mine),
        "pages": mine[0].pages,
        "streams_min": min(w.streams for w in mine),
        "frames_min": min(min(w.frames) for w in mine),
        "frames_median": statistics.median(f for w in mine for f in w.frames),
        "fps_min": min(per_page_fps),
        "fps_median": statistics.median(per_page_fps),
        "seconds": seconds,
        "cpu_s": cpu,
        "cores": cpu / seconds,
        "delivered": delivered,
        "cpu_ms_per_frame": cpu * 1e3 / delivered if delivered else float("nan"),
        "encoded": sum(w.counters["encoded"] for w in mine),
        "encoded_per_s": sum(w.counters["encoded"] for w in mine) / seconds,
        "viewer_sent": sum(w.counters["viewer_sent"] for w in mine),
        "viewer_dropped": sum(w.counters["viewer_dropped"] for w in mine),
        "harness_cpu_s": sum(w.harness_cpu_s for w in mine),
        "signaling_cpu_s": sum(w.signaling_cpu_s for w in mine),
    }


def table(windows: list[Window], sums: dict[str, dict[str, Any]]) -> list[str]:
    head = (
        f"{'':<14} {'pages':>5} {'frames/page':>13} {'fps/page':>11} {'worker':>8} "
        f"{'cores':>5} {'CPU-ms per':>10} {'frames':>8} {'viewer':>9}"
    )
    head2 = (
        f"{'':<14} {'':>5} {'min / median':>13} {'min / med':>11} {'CPU-s':>8} "
        f"{'':>5} {'delivered':>10} {'encoded':>8} {'sent/drop':>9}"
    )
    lines = [head, head2]

    def row(label: str, streams: int, pages: int, s: dict[str, Any]) -> str:
        frames = f"{s['frames_min']} / {s['frames_median']:g}"
        fps = f"{s['fps_min']:.1f} / {s['fps_median']:.1f}"
        viewer = f"{s['viewer_sent']:.0f}/{s['viewer_dropped']:.0f}"
        return (
            f"{label:<14} {f'{streams}/{pages}':>5} {frames:>13} {fps:>11} {s['cpu_s']:>8.2f} "
            f"{s['cores']:>5.2f} {s['cpu_ms_per_frame']:>10.2f} {s['encoded']:>8.0f} {viewer:>9}"
        )

    for w in windows:
        s = {**w.summary(), **w.counters}
        lines.append(row(f"run {w.run} {w.side}", w.streams, w.pages, s))
    lines.append("")
    for side in SIDES:
        s = sums[side]
        lines.append(row(f"all {side}", s["streams_min"], s["pages"], s))
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--viewers", type=int, default=3, help="viewers of the shared session")
    parser.add_argument("--runs", type=int, default=2, help="runs of each side, in turns")
    parser.add_argument("--seconds", type=float, default=8.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=2.0, help="after every page's 1st frame")
    parser.add_argument("--resolution", default="640x360")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead")
    parser.add_argument("--log-dir", type=Path, help="the children's logs (default: a temp dir)")
    args = parser.parse_args()
    if args.viewers < 1 or args.runs < 1 or args.seconds <= 0:
        parser.error("--viewers and --runs must be at least 1, --seconds above 0")
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="sharing-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    secret = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RENDER_SERVER_")}
    env |= {
        "RENDER_SERVER_SECRET": secret,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    auth = Authenticator({"default": secret.encode()})
    pages = args.viewers + 1
    port, metrics_port = free_port(), free_port()
    worker_args = [
        "worker", "--signaling", f"ws://127.0.0.1:{port}/worker", "--worker-id", "bench",
        "--metrics-port", str(metrics_port), "--slots", str(pages), "--processes", "1",
        "--resolution", args.resolution, "--fps", f"{args.fps:g}", "--renderer", "cpu",
        "--encoder", "x264", "--animate", "--max-viewers", str(max(8, args.viewers)),
        "--drain-timeout", "2",
    ]  # fmt: skip
    children: list[Child] = []
    t_start = time.monotonic()
    try:
        signaling = spawn(
            "signaling",
            ["signaling", "--host", "127.0.0.1", "--port", str(port), "--heartbeat-timeout", "10"],
            env, log_dir,
        )  # fmt: skip
        children.append(signaling)
        wait_until_up(signaling, f"http://127.0.0.1:{port}/readyz")
        worker = spawn("worker", worker_args, env, log_dir)
        children.append(worker)
        wait_until_up(worker, f"http://127.0.0.1:{metrics_port}/readyz")
        setup = Setup(
            f"http://127.0.0.1:{port}", auth, worker.process.pid, signaling.process.pid,
            metrics_port, args.viewers, args.seconds, args.warmup,
        )  # fmt: skip
        log(f"worker up (pid {worker.process.pid}); logs in {log_dir}")
        windows = asyncio.run(run_all(setup, args.runs))
    except BaseException:
        for child in children:
            log(f"--- {child.name}'s log ---\n{child.tail()}")
        raise
    finally:
        stop(children)
    elapsed = time.monotonic() - t_start

    sums = {side: totals(windows, side) for side in SIDES}
    shared, separate = sums["shared"], sums["separate"]
    ratio_cpu = separate["cpu_s"] / shared["cpu_s"] if shared["cpu_s"] else float("nan")
    ratio_frame = (
        separate["cpu_ms_per_frame"] / shared["cpu_ms_per_frame"]
        if shared["cpu_ms_per_frame"]
        else float("nan")
    )
    worker_command = "render-server " + " ".join(shlex.quote(a) for a in worker_args)
    # per frame sent, taking the worker's CPU as linear in the frames: a frame of a session of
    # its own costs what the separate side's do; a frame sent to a viewer, what the shared side
    # spent beyond its owner's frames (at that price), over the frames its viewers got
    session_ms = separate["cpu_ms_per_frame"]
    owner_frames = sum(w.frames[0] for w in windows if w.side == "shared")
    viewer_frames = shared["delivered"] - owner_frames
    viewer_ms = (
        (shared["cpu_s"] * 1e3 - owner_frames * session_ms) / viewer_frames
        if viewer_frames
        else float("nan")
    )
    if args.json:
        print(json.dumps({
            "command": command, "worker": worker_command, "cores": os.cpu_count(),
            "elapsed_s": elapsed, "windows": [w.summary() for w in windows], "sides": sums,
            "ratio_separate_over_shared": {"worker_cpu": ratio_cpu, "cpu_per_frame": ratio_frame},
            "cpu_ms_per_frame_sent": {"session": session_ms, "viewer": viewer_ms},
        }, indent=2))  # fmt: skip
        return 0
    print(command)
    print(
        f"worker: {worker_command}\n{pages} pages a side ({args.viewers} viewers + their owner | "
        f"{pages} sessions), {args.resolution} at {args.fps:g} fps, windows of "
        f"{args.seconds:g} s, {os.cpu_count()} cores, {elapsed:.0f} s in all; worker CPU from "
        f"/proc/<pid>/stat"
    )
    print()
    for line in table(windows, sums):
        print(line)
    print()
    print(
        f"separate / shared: worker CPU {ratio_cpu:.2f}x, worker CPU per delivered frame "
        f"{ratio_frame:.2f}x; frames encoded per second {shared['encoded_per_s']:.1f} shared, "
        f"{separate['encoded_per_s']:.1f} separate"
    )
    print(
        f"per frame sent (the worker's CPU taken as linear in frames): to a session of its "
        f"own {session_ms:.2f} CPU-ms, to a viewer {viewer_ms:.2f} CPU-ms "
        f"({viewer_ms / session_ms:.0%} of a session's)"
    )
    print(
        f"for scale (not the worker): the receivers (this process) used "
        f"{shared['harness_cpu_s']:.2f} / {separate['harness_cpu_s']:.2f} CPU-s, signaling "
        f"{shared['signaling_cpu_s']:.2f} / {separate['signaling_cpu_s']:.2f} (shared / separate)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
