"""Milliseconds per frame of the CPU renderer as it serves, against a frame copy in the same run.

    python benchmarks/render.py [--frames 60] [--resolutions 1280x720,1920x1080] [--bands N]

Draws the default scene from a few camera poses, among them a camera low over the ground and
looking along it (the ground then covers half the view and passes under and behind the camera).
Each pose is drawn `--frames` times after a warm-up. A frame is what `CpuRenderer.render` does
when serving: the visibility pass on the calling thread, then the shading pass in bands of
rows at once, the first on the calling thread and the others on the shared band pool
(render/bands.py). `--bands` sets how many (default: RENDER_SERVER_RENDER_BANDS, else one per
core up to 4; 1 keeps the whole frame on one thread).

The figures per pose: the median and the 95th percentile of the wall time of the whole
`render()` call (the latency a session sees), and the median CPU time of the process over the
call (what the frame costs, all threads together). The baseline is numpy copying a frame of
the same size (`np.copyto` of an (H, W, 3) uint8 array): cheap and steady, it puts the figures
of a noisy machine in proportion. The first lines say how long loading (or compiling) the
kernels took.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from render_server.render import CpuRenderer, OrbitCamera, Scene, default_scene
from render_server.render.bands import DEFAULT_BANDS
from render_server.tools.stats import median_p95


def poses(scene: Scene) -> dict[str, OrbitCamera]:
    framed = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    close = framed.copy()
    close.orbit(1.2, -0.2)
    close.zoom(0.6)
    ground = framed.copy()  # low over the ground plate, looking along it
    ground.target, ground.distance, ground.pitch = (0.0, 0.15, 0.0), 6.0, 0.02
    above = framed.copy()
    above.orbit(2.5, 0.6)
    return {"framed": framed, "close": close, "ground": ground, "above": above}


def time_render(
    renderer: CpuRenderer, camera: OrbitCamera, frames: int
) -> tuple[list[float], list[float]]:
    """Wall and process CPU milliseconds of each of `frames` calls, after a warm-up."""
    for _ in range(3):
        renderer.render(camera)
    wall, cpu = [], []
    for _ in range(frames):
        c0, t0 = time.process_time(), time.perf_counter()
        renderer.render(camera)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return wall, cpu


def time_copy(width: int, height: int, repeats: int = 200) -> list[float]:
    src = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    dst = np.empty_like(src)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--resolutions", default="1280x720,1920x1080")
    parser.add_argument(
        "--bands",
        type=int,
        default=DEFAULT_BANDS,
        help=f"bands of rows shaded at once (default here: {DEFAULT_BANDS}; 1: one thread)",
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    scene = default_scene()
    t1 = time.perf_counter()
    first = CpuRenderer(scene, 64, 36)  # the visibility kernel, the shadow map
    t2 = time.perf_counter()
    first.render(OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max))  # the shading kernel
    t3 = time.perf_counter()
    print(f"default scene: {scene.triangle_count} triangles, built in {(t1 - t0) * 1e3:.0f} ms")
    print(f"kernels ready (compiled, or loaded from numba's cache): {t3 - t1:.2f} s")
    print(f"  visibility + shadow map {t2 - t1:.2f} s, shading {t3 - t2:.2f} s")
    print(
        f"visibility on the calling thread; shading in {args.bands} bands of rows at once, the "
        f"first on the calling thread, the others on the shared pool of {DEFAULT_BANDS} threads; "
        f"{args.frames} frames per pose\n"
    )
    print(
        f"{'size':>9}  {'pose':<7} {'median ms':>9} {'p95 ms':>7} {'cpu ms':>7} "
        f"{'copy ms':>8} {'× copy':>7}"
    )
    for size in args.resolutions.split(","):
        width, height = (int(v) for v in size.lower().split("x"))
        renderer = CpuRenderer(scene, width, height, bands=args.bands)
        copy_ms, _ = median_p95(time_copy(width, height))
        for name, camera in poses(scene).items():
            wall, cpu = time_render(renderer, camera, args.frames)
            median, p95 = median_p95(wall)
            print(
                f"{size:>9}  {name:<7} {median:9.2f} {p95:7.2f} {statistics.median(cpu):7.2f} "
                f"{copy_ms:8.3f} {median / copy_ms:7.0f}"
            )


if __name__ == "__main__":
    main()
