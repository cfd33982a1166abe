"""CPU cost of one streaming session of `render-server serve`, seen from outside the process.

    python benchmarks/session_cpu.py [--resolution 1280x720] [--fps 30] [--seconds 10]

Starts the server as a user does, connects the Python viewer (real aiortc peer on loopback) and
reads the server's CPU time from /proc while frames flow: once with `--animate` (the camera moves,
so every frame is rendered, converted and encoded) and once with a still camera (the baseline of
the same run: the last picture is only re-encoded). Prints both and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request

from render_server.tools.viewer import Viewer


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(args: argparse.Namespace, animate: bool, port: int) -> tuple[float, float]:
    command = [sys.executable, "-m", "render_server", "serve", "--port", str(port),
               "--resolution", args.resolution, "--fps", str(args.fps)]  # fmt: skip
    process = subprocess.Popen(
        command + (["--animate"] if animate else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        async with Viewer(f"ws://127.0.0.1:{port}/ws") as viewer:
            for _ in range(30):  # past the first keyframe and the start-up
                await viewer.next_frame(20)
            cpu0, t0, frames = cpu_seconds(process.pid), time.monotonic(), 0
            while time.monotonic() - t0 < args.seconds:
                await viewer.next_frame(5)
                frames += 1
            elapsed = time.monotonic() - t0
            return (cpu_seconds(process.pid) - cpu0) / elapsed, frames / elapsed
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", default="1280x720")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=8097)
    args = parser.parse_args()
    moving, moving_fps = asyncio.run(measure(args, True, args.port))
    still, still_fps = asyncio.run(measure(args, False, args.port + 1))
    print(f"one {args.resolution} {args.fps:g} fps session, server process CPU (cores):")
    print(f"  camera moving every frame: {moving:.2f} ({moving_fps:.1f} fps received)")
    print(f"  still camera (baseline):   {still:.2f} ({still_fps:.1f} fps received)")
    print(f"  moving / still: {moving / still:.2f}x")


if __name__ == "__main__":
    main()
