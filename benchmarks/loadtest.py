"""Load-test figures on this machine, everything on loopback, each server started here.

    python benchmarks/loadtest.py [--hold 30] [--search-hold 10] [--skip a,b,c,d]
        [--processes 2] [--max-4k 12] [--receiver lean|count] [--send-streams 8] [--send-hold 10]
        [--send-rounds 3] [--send-profile 720p30|4k60] [--transport-feedback]

(a) `--encoder replay`, 20 streams of 1280x720 at 30 fps, 4 Mbps each: every stream ≥ 29 fps,
    no freeze?
(b) `--encoder replay`, 4 streams of 3840x2160 at 60 fps, 25 Mbps each: fps held and the CPU
    used by the harness and by the server; then upward from 4 for the most such streams held,
    every one at ≥ 58 fps with no freeze and no failure. With `--transport-feedback` the
    clients send transport-cc feedback, as browsers do, rather than REMB alone.
(c) RTP packets per CPU-second on the send path: the server's process (`--encoder replay`,
    `--send-streams` sessions of 720p30 at 4 Mbps, or of 4K60 at 25 Mbps with `--send-profile
    4k60`: three times the packets a frame) against plain aiortc in the same run. The
    baseline is a process of aiortc peer connections, one per stream, each with a
    `MediaStreamTrack` returning the same pre-encoded `av.Packet`s (the same clip, built by
    the same function), paced at the same rate, H.264 only (our sessions' own
    `codec_preferences("H264")`), with the same playout-delay extension negotiated and
    requested; it has no signaling. Ours runs `--fec off`: the observing peers offer RED and
    ULPFEC (this script's process registered them with aiortc), which stock aiortc never sends,
    so both sides send the clip's plain H.264 packets. Both sides are counted the same
    way, by the same code in this script, and at once: both sides stream together and the
    same kind of observing aiortc receivers (no decoding, offering the playout-delay extension
    as Chromium does) count the RTP packets and frames they got, and each sender's CPU time
    (`cpu_time.tree_cpu_seconds_or_raise`: the process and its children, if any) is read at
    the same instants, `--send-rounds` windows of `--send-hold` seconds in a row, the first
    opening once every stream is up plus a warm-up (this VM's load drifts; counted side by
    side, both sides see the same). Printed per side: packets, frames and fps, seconds, CPU
    seconds, packets per CPU-second over all windows; then the ratio ours / plain, over all
    and per window. Our process also does everything else a session costs (signaling, the
    `input` data channel the receivers open,
    timing records): a ratio below 1 is what that extra work costs.
(d) The real pipeline (CPU renderer, libx264, `--animate` so that every frame changes): the
    most 720p30 streams held, every one at ≥ 29 fps.

(a), (b) and (d) are runs of `render-server loadtest ... --json`; the commands are printed with the
table so that each figure can be reproduced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
from render_server.cpu_time import tree_cpu_seconds_or_raise  # noqa: E402
from render_server.tools.local_server import local_server  # noqa: E402

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}
HARNESS_TIMEOUT_S = 900.0
CPU_SAMPLE_S = 0.25  # the server's CPU, read this often where a run asks (`cpu_between`)
PLAYOUT_DELAY = "low"  # what `serve` asks for by default; the plain sender asks for the same
# (c)'s streams: size, frame rate, bitrate
SEND_PROFILES = {"720p30": ("1280x720", 30.0, 4_000_000), "4k60": ("3840x2160", 60.0, 25_000_000)}
SEND_WARMUP_S = 2.0  # (c): every stream up, then this long before the window opens


@contextlib.contextmanager
def serve(*args: str, log: Path, timeout: float = 300.0) -> Iterator[tuple[str, int, list[str]]]:
    """`render-server serve` on a free port; (url, pid, command)."""
    with local_server(*args, log_path=log, timeout=timeout, env=ENV, cwd=ROOT) as server:
        yield server.url, server.process.pid, server.command


def replay_args(size: str, fps: float, bitrate: int, slots: int) -> tuple[str, ...]:
    """`serve`'s arguments for `--encoder replay` streams of `size` at `fps` and `bitrate`."""
    return ("--encoder", "replay", "--resolution", size, "--fps", f"{fps:g}",
            "--bitrate", str(bitrate), "--slots", str(slots))  # fmt: skip


def shell_line(command: list[str]) -> str:
    """`command` as a shell line, without the interpreter (printed after "python ")."""
    return " ".join(shlex.quote(c) for c in command[1:])


def niced(command: list[str], nice: int) -> list[str]:
    """`command` run at niceness `nice` (as is for 0 or less): where server and harness share
    a machine's cores, the scheduler then gives them to the server first, and the harness
    runs on what the server leaves (it still gets a share: CFS starves nobody)."""
    return ["nice", "-n", str(nice), *command] if nice > 0 else command


def loadtest(
    url: str,
    pid: int,
    out: Path,
    *args: str,
    cpu_samples: list[tuple[float, float]] | None = None,
    machine_samples: list[tuple[float, MachineSeconds]] | None = None,
    nice: int = 0,
) -> tuple[dict[str, Any], float, str]:
    """One harness run; (report, the server's CPU seconds over it, the command). Where
    `cpu_samples` is given, it gets (time.monotonic() ms, server CPU seconds) every
    `CPU_SAMPLE_S` while the harness runs (see `cpu_between`), and `machine_samples` the
    whole machine's (`machine_seconds`) at the same instants. A `nice` above 0 runs the
    harness at that niceness (`niced`)."""
    command = [PY, "-m", "render_server", "loadtest", "--server", url, *args,
               "--report", str(out), "--json", "--no-progress"]  # fmt: skip
    shown = " ".join([*niced(["python"], nice), shell_line(command)]).replace(url, "$URL")
    command = niced(command, nice)
    before = tree_cpu_seconds_or_raise(pid)
    # files, not pipes: a report larger than a pipe's buffer would block the harness at its
    # end while this loop samples
    with tempfile.TemporaryFile("w+") as out_file, tempfile.TemporaryFile("w+") as err_file:
        with subprocess.Popen(
            command, stdout=out_file, stderr=err_file, text=True, cwd=ROOT, env=ENV
        ) as harness:
            deadline = time.monotonic() + HARNESS_TIMEOUT_S
            while cpu_samples is not None and harness.poll() is None:
                cpu_samples.append((time.monotonic() * 1e3, tree_cpu_seconds_or_raise(pid)))
                if machine_samples is not None:
                    machine_samples.append((time.monotonic() * 1e3, machine_seconds()))
                time.sleep(CPU_SAMPLE_S)
                if time.monotonic() > deadline:
                    harness.kill()
            harness.wait(timeout=max(1.0, deadline - time.monotonic()))
        out_file.seek(0)
        err_file.seek(0)
        stdout, stderr = out_file.read(), err_file.read()
    server_cpu = tree_cpu_seconds_or_raise(pid) - before
    if harness.returncode not in (0, 1):
        raise RuntimeError(f"loadtest exited {harness.returncode}: {stderr[-2000:]}")
    return json.loads(stdout), server_cpu, shown


class MachineSeconds(NamedTuple):
    """What the whole machine's cores did not give to processes so far (/proc/stat, all cores
    summed, seconds)."""

    idle: float  # idle and waiting for I/O
    steal: float  # taken by the hypervisor


def machine_seconds() -> MachineSeconds:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    idle, iowait, steal = int(fields[4]), int(fields[5]), int(fields[8])  # "cpu" user nice ...
    tick = os.sysconf("SC_CLK_TCK")
    return MachineSeconds((idle + iowait) / tick, steal / tick)


def cpu_between(samples: list[tuple[float, float]], start_ms: float, end_ms: float) -> float:
    """CPU seconds between two instants, read off (ms, CPU seconds) samples in time order by
    linear interpolation (NaN where the samples do not cover the window)."""

    def at(ms: float) -> float:
        for (t0, c0), (t1, c1) in zip(samples, samples[1:], strict=False):
            if t0 <= ms <= t1:
                return c0 + (c1 - c0) * (ms - t0) / (t1 - t0) if t1 > t0 else c0
        return float("nan")

    return at(end_ms) - at(start_ms)


def held(report: dict[str, Any], min_fps: float) -> bool:
    streams = report["streams"]
    return all(
        s["state"] == "closed" and not s["freezes_hold"] and (s["fps_hold"] or 0) >= min_fps
        for s in streams
    )


def describe(report: dict[str, Any], server_cpu: float) -> str:
    a = report["aggregate"]
    lat = a["latency_ms"] or {}
    wall = report["wall_s"]
    late = report["server_check"].get("server_late_timers", "?")
    pauses = report["server_check"].get("server_session_pauses", "?")
    return (
        f"fps min {a['fps_hold_min']:.1f} median {a['fps_hold_median']}, {a['failed']} failed, "
        f"{a['frozen']} froze in the hold ({a['frozen_in_ramp']} in the ramp), "
        f"{a['mbps_total']:.0f} Mbps, latency p50/p95 "
        f"{lat.get('p50', float('nan')):.1f}/{lat.get('p95', float('nan')):.1f} ms, CPU "
        f"server {server_cpu / wall:.2f} + harness {report['harness']['cpu_s'] / wall:.2f} "
        f"cores, server timers > 50 ms late: {late}, sessions paused by the server (their "
        f"client silent 3 s): {pauses}"
    )


# -- (c) the send path: ours against plain aiortc, counted the same way ---------------------------


@dataclass
class SendWindow:
    """What one sender delivered to the observing receivers over the measured window."""

    packets: int  # RTP packets of the video the receivers got (RTX unwrapped and counted)
    frames: int  # frames the receivers closed
    seconds: float
    cpu_s: float  # the sender process's CPU time over the same window
    streams: int
    playout_delay: int  # answers that carry the playout-delay extension

    @property
    def packets_per_cpu_s(self) -> float:
        return self.packets / self.cpu_s if self.cpu_s else float("nan")

    def describe(self) -> str:
        return (
            f"{self.packets:,} packets, {self.frames:,} frames ({self.frames / self.seconds:.1f} "
            f"fps over {self.streams} streams), {self.seconds:.1f} s, {self.cpu_s:.2f} CPU-s "
            f"-> {self.packets_per_cpu_s:,.0f} packets/CPU-s"
        )


def _observing_peer() -> tuple[Any, Any]:
    """A recvonly aiortc peer whose packets a `FrameAssembler` counts (aiortc never decodes)."""
    from aiortc import RTCPeerConnection

    from render_server.tools.measure.frames import FrameAssembler
    from render_server.transport.receiver_hook import observe_receiver

    pc = RTCPeerConnection()
    transceiver = pc.addTransceiver("video", direction="recvonly")
    assembler = FrameAssembler(lambda frame, unit: None)
    observe_receiver(transceiver.receiver, assembler.add)
    return pc, assembler


def _sample(assemblers: list[Any], pid: int) -> tuple[int, int, float, float]:
    """(packets, frames, now, CPU seconds of `pid`) at one instant."""
    packets = sum(a.stats.packets for a in assemblers)
    frames = sum(a.stats.frames for a in assemblers)
    return packets, frames, time.monotonic(), tree_cpu_seconds_or_raise(pid)


async def count_windows(
    sides: list[tuple[list[Any], int, int]], hold: float, rounds: int
) -> list[list[SendWindow]]:
    """Wait for a frame on every stream of every side (its receivers' assemblers, its
    sender's pid, its answers with the playout-delay extension) and the warm-up, then count
    every side over the same `rounds` windows of `hold` seconds, all sides read at the same
    instants: one list of windows per side."""
    everyone = [a for assemblers, _, _ in sides for a in assemblers]
    deadline = time.monotonic() + 60.0
    while not all(a.stats.frames for a in everyone):
        if time.monotonic() > deadline:
            raise RuntimeError("a stream sent no frame within 60 s")
        await asyncio.sleep(0.1)
    await asyncio.sleep(SEND_WARMUP_S)
    windows: list[list[SendWindow]] = [[] for _ in sides]
    before = [_sample(assemblers, pid) for assemblers, pid, _ in sides]
    for _ in range(rounds):
        await asyncio.sleep(hold)
        after = [_sample(assemblers, pid) for assemblers, pid, _ in sides]
        for side, (b, a) in enumerate(zip(before, after, strict=True)):
            assemblers, _, extension = sides[side]
            windows[side].append(SendWindow(
                a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], len(assemblers), extension
            ))  # fmt: skip
        before = after
    return windows


@contextlib.asynccontextmanager
async def our_sessions(url: str, streams: int) -> AsyncIterator[tuple[list[Any], list[Any]]]:
    """`streams` sessions of the server at `url`, each opened through its signaling as a
    browser does (video and the `input` data channel): their assemblers and peers."""
    from render_server.tools.signaling_client import SignalingClient
    from render_server.transport.playout_delay import register_playout_delay

    register_playout_delay()  # offered, as Chromium offers it
    clients, pcs, assemblers = [], [], []
    try:
        for _ in range(streams):
            client = SignalingClient(url)
            clients.append(client)
            await client.start()
            pc, assembler = _observing_peer()
            pcs.append(pc)
            assemblers.append(assembler)
            pc.createDataChannel("input")
            await client.negotiate(pc)
        yield assemblers, pcs
    finally:
        for client in clients:
            await client.end()
        for pc in pcs:
            await pc.close()
        for client in clients:
            await client.close()


def _plain_sender(conn: Any, size: str, fps: float, bitrate: int) -> None:
    """A process of plain aiortc senders: one per offer from `conn`, each sending the clip,
    until `conn` says "stop"."""
    import av
    from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription

    from render_server.config import Resolution
    from render_server.encode.replay import RTP_TIME_BASE, RTP_TIME_UNIT, replay_clip
    from render_server.render.builtin_scenes import default_scene
    from render_server.transport.playout_delay import (
        register_playout_delay,
        request_playout_delay,
    )
    from render_server.transport.video_sender import codec_preferences

    register_playout_delay()
    clip = replay_clip(default_scene(), Resolution.parse(size), fps, bitrate)
    h264 = codec_preferences("H264")

    class ClipTrack(MediaStreamTrack):
        kind = "video"

        def __init__(self) -> None:
            super().__init__()
            self.i = 0
            self.start: float | None = None

        async def recv(self) -> Any:  # av.Packet: aiortc's sender only packetizes it
            if self.start is None:
                self.start = time.monotonic()
            await asyncio.sleep(max(0.0, self.start + self.i / fps - time.monotonic()))
            unit = clip.units[self.i % len(clip.units)]
            packet = av.Packet(unit)
            packet.pts = packet.dts = int(self.i * RTP_TIME_BASE / fps)
            packet.time_base = RTP_TIME_UNIT  # as our replay encoder
            self.i += 1
            return packet

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pcs = []
        conn.send("ready")  # the clip is built
        while (offer := await loop.run_in_executor(None, conn.recv)) != "stop":
            pc = RTCPeerConnection()
            pcs.append(pc)
            transceiver = pc.addTransceiver(ClipTrack(), direction="sendonly")
            transceiver.setCodecPreferences(h264)
            request_playout_delay(transceiver.sender, PLAYOUT_DELAY)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            conn.send(pc.localDescription.sdp)
        for pc in pcs:
            await pc.close()

    asyncio.run(main())


@contextlib.asynccontextmanager
async def plain_sessions(
    streams: int, size: str, fps: float, bitrate: int
) -> AsyncIterator[tuple[list[Any], list[Any], int]]:
    """The same receivers on a process of plain aiortc senders: their assemblers and peers,
    and the sender's pid."""
    from aiortc import RTCSessionDescription

    from render_server.transport.playout_delay import register_playout_delay

    register_playout_delay()
    context = mp.get_context("spawn")
    ours, theirs = context.Pipe()
    sender = context.Process(target=_plain_sender, args=(theirs, size, fps, bitrate), daemon=True)
    sender.start()
    assert sender.pid is not None
    loop = asyncio.get_running_loop()
    pcs, assemblers = [], []
    try:
        if not await loop.run_in_executor(None, ours.poll, 300):
            raise RuntimeError("the plain aiortc sender did not start")
        ours.recv()  # "ready"
        for _ in range(streams):
            pc, assembler = _observing_peer()
            pcs.append(pc)
            assemblers.append(assembler)
            await pc.setLocalDescription(await pc.createOffer())
            ours.send(pc.localDescription.sdp)
            answer = await loop.run_in_executor(None, ours.recv)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        yield assemblers, pcs, sender.pid
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        for pc in pcs:
            await pc.close()
        await loop.run_in_executor(None, sender.join, 30)
        if sender.is_alive():
            sender.kill()


async def send_windows(
    url: str, pid: int, streams: int, profile: tuple[str, float, int], hold: float, rounds: int
) -> tuple[list[SendWindow], list[SendWindow]]:
    """Ours (the server at `url`, process `pid`) and plain aiortc, both streaming at once and
    counted over the same windows: this shared VM's load drifts, and both sides see the same."""
    from render_server.transport.playout_delay import PLAYOUT_DELAY_URI

    async with (
        our_sessions(url, streams) as (our_assemblers, our_pcs),
        plain_sessions(streams, *profile) as (plain_assemblers, plain_pcs, plain_pid),
    ):

        def answered(pcs: list[Any]) -> int:
            return sum(PLAYOUT_DELAY_URI in pc.remoteDescription.sdp for pc in pcs)

        ours, plain = await count_windows(
            [(our_assemblers, pid, answered(our_pcs)),
             (plain_assemblers, plain_pid, answered(plain_pcs))],
            hold, rounds,
        )  # fmt: skip
    return ours, plain


def total(windows: list[SendWindow]) -> SendWindow:
    """The windows of one side added up."""
    return SendWindow(
        sum(w.packets for w in windows), sum(w.frames for w in windows),
        sum(w.seconds for w in windows), sum(w.cpu_s for w in windows),
        windows[0].streams, windows[0].playout_delay,
    )  # fmt: skip


# -- the runs -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=30.0, help="seconds of hold in (a) and (b)")
    parser.add_argument("--search-hold", type=float, default=10.0, help="seconds per search step")
    parser.add_argument("--processes", type=int, default=2, help="harness processes")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d")
    parser.add_argument("--max-4k", type=int, default=12, help="where the (b) search stops")
    parser.add_argument(
        "--receiver",
        choices=("lean", "count"),
        default="lean",
        help="the harness's receiver in (b) (count: sampled keyframes decrypted and decoded)",
    )
    parser.add_argument(
        "--transport-feedback",
        action="store_true",
        help="(b)'s clients send transport-cc feedback, as browsers do (the worker then runs "
        "its congestion controller and pacer on every packet), instead of REMB only",
    )
    parser.add_argument("--send-streams", type=int, default=8, help="streams of (c)")
    parser.add_argument("--send-hold", type=float, default=10.0, help="window of (c), seconds")
    parser.add_argument("--send-rounds", type=int, default=3, help="windows of (c), in a row")
    parser.add_argument(
        "--send-profile",
        choices=tuple(SEND_PROFILES),
        default="720p30",
        help="the stream of (c): 720p30 at 4 Mbps, or 4K60 at 25 Mbps (more "
        "packets a frame: 2 streams are what this harness receives)",
    )
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="loadtest-bench-"))
    rows: list[tuple[str, str, str]] = []  # (what, result, command)
    p = str(args.processes)
    t_start = time.monotonic()

    def note(what: str, result: str, command: str) -> None:
        rows.append((what, result, command))
        print(f"[{time.monotonic() - t_start:5.0f} s] {what}: {result}", flush=True)

    serve_720 = replay_args(*SEND_PROFILES["720p30"], slots=24)
    if "a" not in skip:
        with serve(*serve_720, log=work / "serve-720.log") as (url, pid, command):
            serve_cmd = shell_line(command)
            report, cpu, cmd = loadtest(
                url, pid, work / "a", "--streams", "20", "--resolution", "1280x720",
                "--fps", "30", "--duration", str(args.hold), "--ramp", "5",
                "--processes", p, "--min-fps", "29",
            )  # fmt: skip
            verdict = "PASS" if held(report, 29) else "FAIL"
            note("(a) 20 × 720p30 4 Mbps, replay", f"{verdict}: {describe(report, cpu)}",
                 f"python {serve_cmd}\n    {cmd}")  # fmt: skip
    if "c" not in skip:
        size, fps, bitrate = SEND_PROFILES[args.send_profile]
        serve_c = replay_args(size, fps, bitrate, slots=24)
        # the same packets on both sides: the observing aiortc peers offer RED and ULPFEC (this
        # process registered them with aiortc), which stock aiortc never sends, so ours doesn't
        # either: every packet on both sides is a plain H.264 packet of the clip
        with serve(*serve_c, "--fec", "off", log=work / "serve-c.log") as (
            url, pid, command,
        ):  # fmt: skip
            serve_cmd = shell_line(command)
            streams, hold, rounds = args.send_streams, args.send_hold, args.send_rounds
            our_windows, plain_windows = asyncio.run(
                send_windows(url, pid, streams, (size, fps, bitrate), hold, rounds)
            )
            ours, plain = total(our_windows), total(plain_windows)
            ratio = ours.packets_per_cpu_s / plain.packets_per_cpu_s
            each = ", ".join(
                f"{o.packets_per_cpu_s / p.packets_per_cpu_s:.2f}"
                for o, p in zip(our_windows, plain_windows, strict=True)
            )
            extension = f"{ours.playout_delay}/{streams} and {plain.playout_delay}/{streams}"
            stream = f"{args.send_profile} {bitrate / 1e6:g} Mbps"
            note(
                f"(c) send path, {streams} × {stream}, packets the receivers got, both sides "
                f"at once over the same {rounds} windows of {hold:g} s",
                f"ours         {ours.describe()}\n  plain aiortc {plain.describe()}\n"
                f"  ratio ours / plain aiortc, packets per CPU-second: {ratio:.2f} "
                f"(each window: {each}; playout-delay extension in the answers: {extension})",
                f"python {serve_cmd}\n    receivers and plain aiortc sender: "
                f"python benchmarks/loadtest.py --skip a,b,d --send-streams {streams} "
                f"--send-hold {hold:g} --send-rounds {rounds} --send-profile {args.send_profile}",
            )

    if "b" not in skip:
        serve_args = replay_args(*SEND_PROFILES["4k60"], slots=max(args.max_4k, 4))
        with serve(*serve_args, log=work / "serve-4k.log") as (url, pid, command):
            serve_cmd = shell_line(command)
            feedback = ("--transport-feedback",) if args.transport_feedback else ()
            clients = ", transport-cc feedback" if feedback else ""

            def run_4k(n: int, hold: float) -> tuple[dict[str, Any], float, str]:
                return loadtest(
                    url, pid, work / f"b{n}", "--streams", str(n), "--resolution", "3840x2160",
                    "--fps", "60", "--duration", str(hold), "--ramp", "2", "--processes", p,
                    "--min-fps", "58", "--receiver", args.receiver, *feedback,
                )  # fmt: skip

            report, cpu, cmd = run_4k(4, args.hold)
            ok = held(report, 58)
            note(f"(b) 4 × 4K60 25 Mbps, replay{clients}", f"{'PASS' if ok else 'FAIL'}: "
                 f"{describe(report, cpu)}", f"python {serve_cmd}\n    {cmd}")  # fmt: skip
            best = 4 if ok else 0
            n = 5 if ok else 3
            step = 1 if ok else -1
            while 1 <= n <= args.max_4k:
                report, cpu, cmd = run_4k(n, args.search_hold)
                ok = held(report, 58)
                print(f"    {n} × 4K60: {'held' if ok else 'not held'}: {describe(report, cpu)}")
                if ok:
                    best = max(best, n)
                if (step > 0 and not ok) or (step < 0 and ok):
                    break
                n += step
            note(f"(b) most 4K60 streams held at ≥ 58 fps{clients}", str(best),
                 f"python {serve_cmd}\n    {cmd}")  # fmt: skip

    if "d" not in skip:
        serve_args = ("--encoder", "x264", "--renderer", "cpu", "--resolution", "1280x720",
                      "--fps", "30", "--animate", "--slots", "8")  # fmt: skip
        with serve(*serve_args, log=work / "serve-x264.log") as (url, pid, command):
            serve_cmd = shell_line(command)
            best, last = 0, ""
            for n in range(1, 9):
                report, cpu, cmd = loadtest(
                    url, pid, work / f"d{n}", "--streams", str(n), "--resolution", "1280x720",
                    "--fps", "30", "--duration", str(args.search_hold), "--ramp", "1",
                    "--processes", "1", "--min-fps", "29",
                )  # fmt: skip
                ok = held(report, 29)
                print(f"    {n} × x264 720p30: {'held' if ok else 'not held'}: "
                      f"{describe(report, cpu)}")  # fmt: skip
                if not ok:
                    break
                best, last = n, describe(report, cpu)
            note("(d) most 720p30 streams held, CPU renderer + libx264", f"{best} ({last})",
                 f"python {serve_cmd}\n    {cmd}")  # fmt: skip

    print(f"\nloadtest benchmark, {os.cpu_count()} cores, loopback, "
          f"{time.monotonic() - t_start:.0f} s; reports under {work}")  # fmt: skip
    for what, result, command in rows:
        print(f"\n{what}\n  {result}\n  reproduce:\n    {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
