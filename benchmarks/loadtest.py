"""Load-test figures on this machine, everything on loopback, each server started here.

    python benchmarks/loadtest.py [--hold 30] [--search-hold 10] [--skip a,b,c,d]

(a) `--encoder replay`, 20 streams of 1280x720 at 30 fps, 4 Mbps each: every stream ≥ 29 fps,
    no freeze?
(b) `--encoder replay`, 4 streams of 3840x2160 at 60 fps, 25 Mbps each: fps held and the CPU
    used by the harness and by the server; then upward from 4 for the most such streams held,
    every one at ≥ 58 fps with no freeze and no failure.
(c) Packets per second per CPU-second on the send path: the server's process against stock
    aiortc in the same run. The baseline is a plain aiortc `MediaStreamTrack` returning the
    same pre-encoded `av.Packet`s (the same clip, built by the same function), paced at the
    same rate, one peer connection per stream, no signaling, received by the same kind of
    observing aiortc peers. Our figure includes everything the server process does per stream
    (signaling, data channel, timing records); the baseline's only the sending: a ratio below
    1 is what that extra work costs.
(d) The real pipeline (CPU renderer, libx264, `--animate` so that every frame changes): the
    most 720p30 streams held, every one at ≥ 29 fps.

Every harness run is `render-server loadtest ... --json`; the commands are printed with the
table so that each figure can be reproduced.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
from render_server.tools.loadtest.server import worker_counters  # noqa: E402
from render_server.tools.local_server import local_server  # noqa: E402

ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextlib.contextmanager
def serve(*args: str, log: Path, timeout: float = 300.0) -> Iterator[tuple[str, int, list[str]]]:
    """`render-server serve` on a free port; (url, pid, command)."""
    with local_server(*args, log_path=log, timeout=timeout, env=ENV, cwd=ROOT) as server:
        yield server.url, server.process.pid, server.command


def loadtest(url: str, pid: int, out: Path, *args: str) -> tuple[dict[str, Any], float, str]:
    """One harness run; (report, the server's CPU seconds over it, the command)."""
    command = [PY, "-m", "render_server", "loadtest", "--server", url, *args,
               "--report", str(out), "--json", "--no-progress"]  # fmt: skip
    before = cpu_seconds(pid)
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=ENV)
    server_cpu = cpu_seconds(pid) - before
    if done.returncode not in (0, 1):
        raise RuntimeError(f"loadtest exited {done.returncode}: {done.stderr[-2000:]}")
    shown = " ".join(shlex.quote(c) for c in command[1:]).replace(url, "$URL")
    return json.loads(done.stdout), server_cpu, "python " + shown


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
    return (
        f"fps min {a['fps_hold_min']:.1f} median {a['fps_hold_median']}, {a['failed']} failed, "
        f"{a['frozen']} froze in the hold ({a['frozen_in_ramp']} in the ramp), "
        f"{a['mbps_total']:.0f} Mbps, latency p50/p95 "
        f"{lat.get('p50', float('nan')):.1f}/{lat.get('p95', float('nan')):.1f} ms, CPU "
        f"server {server_cpu / wall:.2f} + harness {report['harness']['cpu_s'] / wall:.2f} cores"
    )


class SteadySampler:
    """Samples a server's CPU time and `worker_frames_encoded_total` twice a second, to take
    the send path's cost over the steady part of a run (every stream up), not its setup."""

    def __init__(self, url: str, pid: int) -> None:
        self.url, self.pid = url, pid
        self.samples: list[tuple[float, float, float]] = []  # (time, CPU s, frames)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with urllib.request.urlopen(self.url + "/metrics", timeout=2) as response:
                text = response.read().decode()
            frames = worker_counters(text)["frames"]  # worker_frames_encoded_total
            self.samples.append((time.monotonic(), cpu_seconds(self.pid), frames))

    def stop(self, steady_fps: float) -> tuple[float, float]:
        """(frames, CPU seconds) between the first and last sample pair that ran at ≥ 90%
        of `steady_fps`."""
        self._stop.set()
        self._thread.join()
        s = self.samples
        steady = [
            i for i in range(len(s) - 1)
            if (s[i + 1][2] - s[i][2]) / (s[i + 1][0] - s[i][0]) >= 0.9 * steady_fps
        ]  # fmt: skip
        if not steady:
            raise RuntimeError("the run never reached a steady frame rate")
        first, last = steady[0], steady[-1] + 1
        return s[last][2] - s[first][2], s[last][1] - s[first][1]


# -- (c) the stock aiortc sender ------------------------------------------------------------------


def _stock_sender(
    conn: Any, streams: int, size: str, fps: float, bitrate: int, hold: float
) -> None:
    """A process of plain aiortc senders: each answers an offer from `conn` and sends the clip."""
    import av
    from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription

    from render_server.config import Resolution
    from render_server.encode.replay import RTP_TIME_BASE, replay_clip
    from render_server.render.scene import default_scene

    clip = replay_clip(default_scene(), Resolution.parse(size), fps, bitrate)

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
            packet.time_base = Fraction(1, RTP_TIME_BASE)
            self.i += 1
            return packet

    async def main() -> None:
        pcs = []
        for _ in range(streams):
            pc = RTCPeerConnection()
            pcs.append(pc)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=conn.recv(), type="offer"))
            pc.addTrack(ClipTrack())
            await pc.setLocalDescription(await pc.createAnswer())
            conn.send(pc.localDescription.sdp)
        await asyncio.sleep(1.0)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu0 = usage.ru_utime + usage.ru_stime
        await asyncio.sleep(hold)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        sent = 0
        for pc in pcs:
            for stats in (await pc.getSenders()[0].getStats()).values():
                if stats.type == "outbound-rtp":
                    sent += stats.packetsSent
        conn.send((usage.ru_utime + usage.ru_stime - cpu0, sent))
        for pc in pcs:
            await pc.close()

    asyncio.run(main())


async def _stock_receivers(conn: Any, streams: int, hold: float) -> tuple[int, float]:
    """Observing aiortc receivers for the stock senders: offers out, answers in. Returns the
    packets received in the measured window and its length."""
    from aiortc import RTCPeerConnection, RTCSessionDescription

    from render_server.tools.measure.frames import FrameAssembler, observe_receiver

    assemblers = []
    pcs = []
    loop = asyncio.get_running_loop()
    for _ in range(streams):
        pc = RTCPeerConnection()
        transceiver = pc.addTransceiver("video", direction="recvonly")
        assembler = FrameAssembler(lambda frame, unit: None)
        observe_receiver(transceiver.receiver, assembler)
        assemblers.append(assembler)
        pcs.append(pc)
        await pc.setLocalDescription(await pc.createOffer())
        conn.send(pc.localDescription.sdp)
        answer = await loop.run_in_executor(None, conn.recv)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
    await asyncio.sleep(1.0)
    start = sum(a.stats.packets for a in assemblers)
    await asyncio.sleep(hold)
    received = sum(a.stats.packets for a in assemblers) - start
    result = await loop.run_in_executor(None, conn.recv)
    for pc in pcs:
        await pc.close()
    return received, result


def stock_send_rate(
    streams: int, size: str, fps: float, bitrate: int, hold: float
) -> dict[str, Any]:
    ours, theirs = mp.get_context("spawn").Pipe()
    sender = mp.get_context("spawn").Process(
        target=_stock_sender, args=(theirs, streams, size, fps, bitrate, hold), daemon=True
    )
    sender.start()
    try:
        received, (cpu, sent) = asyncio.run(_stock_receivers(ours, streams, hold))
    finally:
        sender.join(30)
    return {"packets_sent": sent, "packets_received": received, "sender_cpu_s": cpu,
            "hold_s": hold, "packets_per_cpu_s": sent / cpu if cpu else None}  # fmt: skip


# -- the runs -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold", type=float, default=30.0, help="seconds of hold in (a) and (b)")
    parser.add_argument("--search-hold", type=float, default=10.0, help="seconds per search step")
    parser.add_argument("--processes", type=int, default=2, help="harness processes")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: a,b,c,d")
    parser.add_argument("--max-4k", type=int, default=12, help="where the (b) search stops")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    work = Path(tempfile.mkdtemp(prefix="loadtest-bench-"))
    rows: list[tuple[str, str, str]] = []  # (what, result, command)
    p = str(args.processes)
    t_start = time.monotonic()

    def note(what: str, result: str, command: str) -> None:
        rows.append((what, result, command))
        print(f"[{time.monotonic() - t_start:5.0f} s] {what}: {result}", flush=True)

    if "a" not in skip or "c" not in skip:
        serve_args = ("--encoder", "replay", "--resolution", "1280x720", "--fps", "30",
                      "--bitrate", "4000000", "--slots", "24")  # fmt: skip
        with serve(*serve_args, log=work / "serve-720.log") as (url, pid, command):
            serve_cmd = " ".join(shlex.quote(c) for c in command[1:])
            if "a" not in skip:
                report, cpu, cmd = loadtest(
                    url, pid, work / "a", "--streams", "20", "--resolution", "1280x720",
                    "--fps", "30", "--duration", str(args.hold), "--ramp", "5",
                    "--processes", p, "--min-fps", "29",
                )  # fmt: skip
                verdict = "PASS" if held(report, 29) else "FAIL"
                note("(a) 20 × 720p30 4 Mbps, replay", f"{verdict}: {describe(report, cpu)}",
                     f"python {serve_cmd}\n    {cmd}")  # fmt: skip
            if "c" not in skip:
                streams, hold = 8, 10.0
                sampler = SteadySampler(url, pid)
                report, _, cmd = loadtest(
                    url, pid, work / "c", "--streams", str(streams), "--resolution",
                    "1280x720", "--fps", "30", "--duration", str(hold), "--ramp", "1",
                    "--processes", p, "--decode-every", "0",
                )  # fmt: skip
                agg = report["aggregate"]
                frames, ours_cpu = sampler.stop(streams * 30.0)
                ours_packets = frames * agg["packets"] / max(1, agg["frames"])
                ours = ours_packets / ours_cpu
                stock = stock_send_rate(streams, "1280x720", 30.0, 4_000_000, hold)
                theirs = stock["packets_per_cpu_s"]
                note(
                    f"(c) send path, {streams} × 720p30 4 Mbps",
                    f"ours {ours:,.0f} packets/CPU-s ({ours_packets:.0f} packets, {ours_cpu:.1f} "
                    f"CPU-s, steady hold); stock aiortc "
                    f"{theirs:,.0f} packets/CPU-s ({stock['packets_sent']} packets, "
                    f"{stock['sender_cpu_s']:.1f} CPU-s, hold only); ratio ours/stock "
                    f"{ours / theirs:.2f}",
                    f"python {serve_cmd}\n    {cmd}\n    (stock: this script, part c)",
                )

    if "b" not in skip:
        slots = str(max(args.max_4k, 4))
        serve_args = ("--encoder", "replay", "--resolution", "3840x2160", "--fps", "60",
                      "--bitrate", "25000000", "--slots", slots)  # fmt: skip
        with serve(*serve_args, log=work / "serve-4k.log") as (url, pid, command):
            serve_cmd = " ".join(shlex.quote(c) for c in command[1:])

            def run_4k(n: int, hold: float) -> tuple[dict[str, Any], float, str]:
                return loadtest(
                    url, pid, work / f"b{n}", "--streams", str(n), "--resolution", "3840x2160",
                    "--fps", "60", "--duration", str(hold), "--ramp", "2", "--processes", p,
                    "--min-fps", "58",
                )  # fmt: skip

            report, cpu, cmd = run_4k(4, args.hold)
            ok = held(report, 58)
            note("(b) 4 × 4K60 25 Mbps, replay", f"{'PASS' if ok else 'FAIL'}: "
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
            note("(b) most 4K60 streams held at ≥ 58 fps", str(best),
                 f"python {serve_cmd}\n    {cmd}")  # fmt: skip

    if "d" not in skip:
        serve_args = ("--encoder", "x264", "--renderer", "cpu", "--resolution", "1280x720",
                      "--fps", "30", "--animate", "--slots", "8")  # fmt: skip
        with serve(*serve_args, log=work / "serve-x264.log") as (url, pid, command):
            serve_cmd = " ".join(shlex.quote(c) for c in command[1:])
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
