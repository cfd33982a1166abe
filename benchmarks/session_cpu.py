"""CPU cost of one streaming session of `render-server serve`, seen from outside the process.

    python benchmarks/session_cpu.py [--resolution 1280x720] [--fps 30] [--seconds 10]

Starts the server as a user does (`render-server serve`, its default renderer and encoder, at
`--resolution` and `--fps`, with `--idle-fps` at the full frame rate), connects the Python
viewer (a real aiortc peer on loopback) and, past its first 30 frames, reads the server
process's CPU time (`cpu_time.process_cpu_seconds`) at the start and the end of a `--seconds`
window while counting the frames the viewer got in it. Twice: with `--animate` (the camera
moves, so every frame is rendered, converted and encoded), and, as the baseline of the same
run, with a still camera (the same server, viewer and frame rate; the last picture is only
re-encoded). Prints, for both, the frames received, the window, the CPU seconds, the cores and
the CPU-ms per frame received, then the ratios moving / still.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from render_server.cpu_time import process_cpu_seconds_or_raise
from render_server.tools.viewer import Viewer


@dataclass
class Window:
    frames: int  # frames the viewer got in the window
    seconds: float
    cpu_s: float  # the server process's CPU time over the same window

    @property
    def fps(self) -> float:
        return self.frames / self.seconds

    @property
    def cores(self) -> float:
        return self.cpu_s / self.seconds

    @property
    def ms_per_frame(self) -> float:
        return self.cpu_s * 1e3 / self.frames if self.frames else float("nan")

    def describe(self) -> str:
        return (
            f"{self.frames} frames in {self.seconds:.1f} s ({self.fps:.1f} fps received), "
            f"{self.cpu_s:.2f} CPU-s: {self.cores:.2f} cores, {self.ms_per_frame:.1f} CPU-ms/frame"
        )


async def measure(args: argparse.Namespace, animate: bool, port: int) -> Window:
    command = [sys.executable, "-m", "render_server", "serve", "--port", str(port),
               "--resolution", args.resolution, "--fps", str(args.fps),
               "--idle-fps", str(args.fps)]  # fmt: skip
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
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited with {process.returncode}") from None
                time.sleep(0.2)
        async with Viewer(f"ws://127.0.0.1:{port}/ws") as viewer:
            for _ in range(30):  # past the first keyframe and the start-up
                await viewer.next_frame(20)
            cpu0, t0, frames = process_cpu_seconds_or_raise(process.pid), time.monotonic(), 0
            while time.monotonic() - t0 < args.seconds:
                await viewer.next_frame(5)
                frames += 1
            cpu1, t1 = process_cpu_seconds_or_raise(process.pid), time.monotonic()
            return Window(frames, t1 - t0, cpu1 - cpu0)
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--resolution", default="1280x720")
    parser.add_argument("--fps", type=float, default=30.0)
    parser.add_argument("--seconds", type=float, default=10.0, help="the measured window")
    parser.add_argument("--port", type=int, default=8097)
    args = parser.parse_args()
    moving = asyncio.run(measure(args, True, args.port))
    still = asyncio.run(measure(args, False, args.port + 1))
    print(f"one {args.resolution} {args.fps:g} fps session, the server process over the window:")
    print(f"  camera moving every frame: {moving.describe()}")
    print(f"  still camera (baseline):   {still.describe()}")
    print(
        f"  moving / still: {moving.ms_per_frame / still.ms_per_frame:.2f}x the CPU per frame, "
        f"{moving.cores / still.cores:.2f}x the cores"
    )


if __name__ == "__main__":
    main()
