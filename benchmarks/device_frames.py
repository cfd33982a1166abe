"""What handing NVENC a frame in GPU memory costs the CPU, against copying the planes out.

    python benchmarks/device_frames.py [--frames 2000]

The zero-copy path replaces the device → pinned host copy of the NV12 planes with a DLPack
export and a CUDA `av.VideoFrame` around the renderer's buffer. This times, per frame size, the
wrap alone (`blank_device_frame`: two DLPack exports, `VideoFrame.from_dlpack`, no drawing)
and, as the baseline in the same run, a copy of the same number of bytes between host buffers
(`np.copyto`), a lower bound on the copy it replaces (on a GPU that copy crosses PCIe and waits
for the stream). It runs on the host emulation of the CUDA renderer, so it needs no GPU; on a
GPU, `benchmarks/cuda_render.py` times the whole frame both ways.
"""

from __future__ import annotations

import argparse
import functools
import gc
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from render_server.render import default_scene
from render_server.render.cuda import dlpack
from render_server.render.cuda.emulation import EmulatedCudaRenderer, compiler

SIZES = ((1280, 720), (1920, 1080), (3840, 2160))


def median_us(step: Callable[[], object], frames: int) -> float:
    samples = []
    for _ in range(frames):
        t0 = time.perf_counter()
        step()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    if compiler() is None:
        print("no C++ compiler for the host emulation", file=sys.stderr)
        return 2
    scene = default_scene()
    print(f"{'size':>9}  {'wrap µs':>8}  {'copy µs':>8}  {'wrap / copy':>11}")
    for width, height in SIZES:
        with EmulatedCudaRenderer(scene, width, height) as renderer:
            renderer.blank_device_frame()  # allocates the device buffers
            nbytes = width * height * 3 // 2
            source, target = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
            wrap = median_us(renderer.blank_device_frame, args.frames)
            copy = median_us(functools.partial(np.copyto, target, source), args.frames)
        gc.collect()
        print(f"{width}x{height:<4}  {wrap:8.1f}  {copy:8.1f}  {wrap / copy:10.3f}×")
    assert dlpack.live_exports() == 0, "an export was never released"
    return 0


if __name__ == "__main__":
    sys.exit(main())
