"""Milliseconds per frame of the CPU renderer as it serves, the frame path before fused bands
beside it in the same run, and a frame copy for scale.

    python benchmarks/render.py [--frames 60] [--resolutions 1280x720,1920x1080] [--bands N]
                                [--busy N] [--duty D]

Draws the default scene from a few camera poses, among them a camera low over the ground and
looking along it (the ground then covers half the view and passes under and behind the camera).
Each pose is drawn `--frames` times per path after a warm-up, the paths taking turns frame by
frame, so that a change in the machine's load falls on all of them alike. The paths:

- render: `CpuRenderer.render` (RGB). The frame is cut into `--bands` bands of rows (default:
  bands.DEFAULT_BANDS, a few per core), which the calling thread and the shared band pool take
  one by one; each band runs the visibility and the shading pass for its rows.
- picture: `CpuPictures.picture`, what a session does per frame: render, with each band
  converted to YUV 4:2:0 by the thread that drew it.
- old render / old picture: the frame path before (kept here to compare against), with
  today's kernels: the visibility pass over the whole frame on the calling thread, then the
  shading pass in one band per thread, the first on the calling thread and the others on a
  pool, all awaited (fork/join); for the picture, then the conversion, fork/join likewise.

`--busy N` runs N processes that spin on a core each beside the renderer for as long as the
measurement lasts, `--duty` of every 1/60 s (default: all of it). They stand in for a browser
decoding the stream on the same machine, started apart from the server: in a session of their
own, which Linux's autogroup scheduling gives as much of the cores as the renderer's session
(so with one spinning on two cores the renderer gets about one core, and its CPU time per
frame is what counts). Spinning part of each 1/60 s is closer to a decoder's bursts: cores are
taken and given back during a frame, which is where waiting on a descheduled thread cost most.

The figures per pose and path: the median and the 95th percentile of the wall time of the call
(the latency a session sees), and the median CPU time of this process over the call (what the
frame costs, all threads together). The baseline is numpy copying a frame of the same size
(`np.copyto` of an (H, W, 3) uint8 array): cheap and steady, it puts the figures of a noisy
machine in proportion. The first lines say how long loading (or compiling) the kernels took.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.render_poses

from render_server.encode.convert import YuvConverter  # noqa: E402
from render_server.render import CpuRenderer, OrbitCamera, Scene, default_scene  # noqa: E402
from render_server.render.bands import DEFAULT_BANDS, THREADS, split_rows  # noqa: E402
from render_server.render.cpu.prepare import prepare_scene, view_constants  # noqa: E402
from render_server.render.cpu.raster import PLANE_WIDTH, visibility  # noqa: E402
from render_server.render.cpu.shading import shade  # noqa: E402
from render_server.stream.pictures import CpuPictures  # noqa: E402
from render_server.tools.stats import median_p95  # noqa: E402
from tests.render_poses import poses  # noqa: E402


def fork_join(
    work: Callable[[int, int], None], bands: Sequence[tuple[int, int]], pool: ThreadPoolExecutor
) -> None:
    """The old `bands.run_in_bands`: the first band here, one per pool thread, all awaited."""
    others = [pool.submit(work, *band) for band in bands[1:]]
    work(*bands[0])
    for future in others:
        future.result()


class OldPath:
    """The frame path before fused bands, from the same kernels (see the module's text)."""

    def __init__(self, scene: Scene, width: int, height: int, threads: int) -> None:
        self.p = prepare_scene(scene)
        self.width, self.height = width, height
        self.bands = split_rows(height, threads, step=2)
        self.pool = ThreadPoolExecutor(max(1, threads - 1), thread_name_prefix="old-band")
        self.depth = np.empty((height, width), dtype=np.float32)
        self.ids = np.empty((height, width), dtype=np.int32)
        self.planes = np.zeros((scene.triangle_count, PLANE_WIDTH), dtype=np.float64)
        self.row_lo = np.empty(height, dtype=np.int32)
        self.row_hi = np.empty(height, dtype=np.int32)
        self.frame = np.empty((height, width, 3), dtype=np.uint8)
        self.converter = YuvConverter(width, height)

    def render(self, camera: OrbitCamera) -> np.ndarray:
        p = self.p
        visibility(
            p.positions, p.cull_back, camera.view_projection(self.width / self.height),
            self.depth, self.ids, self.planes, self.row_lo, self.row_hi,
        )  # fmt: skip
        view = view_constants(camera, self.width, self.height, p.floor)

        def shade_rows(start: int, stop: int) -> None:
            shade(
                self.ids, self.planes, p.triangles, p.material_ids, p.materials, view, p.light,
                p.shadow_matrix, p.shadow_tiles, p.shadow_coarse, p.lut, self.row_lo,
                self.row_hi, self.frame, start, stop,
            )  # fmt: skip

        fork_join(shade_rows, self.bands, self.pool)
        return self.frame

    def picture(self, camera: OrbitCamera) -> None:
        rgb = self.render(camera)
        fork_join(self.converter.rows(rgb), self.bands, self.pool)


def time_paths(
    paths: dict[str, Callable[[OrbitCamera], object]], camera: OrbitCamera, frames: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and process CPU milliseconds of `frames` calls of each path, taking turns."""
    for _ in range(3):
        for call in paths.values():
            call(camera)
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in paths}
    for _ in range(frames):
        for name, call in paths.items():
            c0, t0 = time.process_time(), time.perf_counter()
            call(camera)
            samples[name][0].append((time.perf_counter() - t0) * 1e3)
            samples[name][1].append((time.process_time() - c0) * 1e3)
    return samples


def time_copy(width: int, height: int, repeats: int = 200) -> list[float]:
    src = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    dst = np.empty_like(src)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


SPIN = """
import os, time
for _ in range({count} - 1):
    if os.fork() == 0:
        break
period = 1 / 60
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < {duty} * period:
        pass
    if {duty} < 1:
        time.sleep(period - (time.perf_counter() - start) % period)
"""


def spin(count: int, duty: float) -> subprocess.Popen[bytes] | None:
    """`count` processes that keep a core busy each, `duty` of every 1/60 s, in a session of
    their own (as a browser started apart from the server is: the scheduler then shares the
    cores between the two sessions rather than between all their threads). Stop them with
    `stop`."""
    if count <= 0:
        return None
    code = SPIN.format(count=count, duty=duty)
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def stop(busy: subprocess.Popen[bytes] | None) -> None:
    if busy is not None:
        os.killpg(busy.pid, signal.SIGTERM)  # the group the session started with: all of them
        busy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--resolutions", default="1280x720,1920x1080")
    parser.add_argument(
        "--bands",
        type=int,
        default=DEFAULT_BANDS,
        help=f"bands of rows per frame (default here: {DEFAULT_BANDS}; 1: one thread)",
    )
    parser.add_argument("--busy", type=int, default=0, help="processes spinning beside")
    parser.add_argument(
        "--duty", type=float, default=1.0, help="share of every 1/60 s they spin (default: all)"
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    scene = default_scene()
    t1 = time.perf_counter()
    first = CpuRenderer(scene, 64, 36)  # the shadow map (the visibility kernel)
    t2 = time.perf_counter()
    first.render(OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max))  # the band kernels
    t3 = time.perf_counter()
    print(f"default scene: {scene.triangle_count} triangles, built in {(t1 - t0) * 1e3:.0f} ms")
    print(f"kernels ready (compiled, or loaded from numba's cache): {t3 - t1:.2f} s")
    print(f"  visibility + shadow map {t2 - t1:.2f} s, frame bands {t3 - t2:.2f} s")
    print(
        f"render/picture: {args.bands} bands taken by {THREADS} threads (the calling one and "
        f"the shared pool); old: visibility on the calling thread, then shading (and "
        f"conversion) in {THREADS} bands, fork/join; {args.frames} frames per pose and path; "
        f"{args.busy} busy processes beside ({args.duty:.0%} of the time)\n"
    )
    print(f"{'size':>9}  {'pose':<7} {'path':<12} {'median ms':>9} {'p95 ms':>7} {'cpu ms':>7}")
    busy = spin(args.busy, args.duty)
    try:
        for size in args.resolutions.split(","):
            width, height = (int(v) for v in size.lower().split("x"))
            renderer = CpuRenderer(scene, width, height, bands=args.bands)
            pictures = CpuPictures(CpuRenderer(scene, width, height, bands=args.bands))
            old = OldPath(scene, width, height, THREADS)
            paths: dict[str, Callable[[OrbitCamera], object]] = {
                "render": renderer.render,
                "picture": pictures.picture,
                "old render": old.render,
                "old picture": old.picture,
            }
            for name, camera in poses(scene).items():
                for path, (wall, cpu) in time_paths(paths, camera, args.frames).items():
                    median, p95 = median_p95(wall)
                    print(
                        f"{size:>9}  {name:<7} {path:<12} {median:9.2f} {p95:7.2f} "
                        f"{statistics.median(cpu):7.2f}"
                    )
            copy_ms, _ = median_p95(time_copy(width, height))
            print(f"{size:>9}  frame copy {copy_ms:.3f} ms (np.copyto)")
    finally:
        stop(busy)


if __name__ == "__main__":
    main()
