"""Milliseconds per frame of the CUDA renderer, per stage and end to end, against the CPU renderer.

    python benchmarks/cuda_render.py [--frames 200] [--cpu-frames 30]
                                     [--resolutions 1920x1080,3840x2160]

For the default scene and a scene of about a million triangles (a field of icospheres), at each
resolution: `--frames` frames (at least 200) of `render_frame(camera, "nv12")`, the serving
path (render, convert to NV12 on the GPU, one copy into pinned host memory), with the camera
orbiting a little each frame. Per stage: the median and 95th percentile of `last_timings`
(CUDA events); end to end: the wall time of the call. Then the frames per second the end-to-end
median implies, and the wall time of `render_device_frame`, the zero-copy path (NV12 left in
device memory, wrapped as a CUDA `av.VideoFrame` for NVENC), against it. The baseline,
measured in the same run: the CPU renderer drawing the default scene at 1080p (its shading
pass in `bands.DEFAULT_BANDS` bands of rows at once, one per core up to 4, as it serves),
against `render()` (RGB readback) of the CUDA renderer, the same work. Exits with code 2
when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

from render_server.render import CpuRenderer, OrbitCamera, Scene, default_scene
from render_server.render.bands import DEFAULT_BANDS
from render_server.render.builtin_scenes import sphere_field
from render_server.render.cuda.renderer import CudaRenderer, CudaUnavailable
from render_server.tools.stats import median_p95


def frames_of(
    renderer: CudaRenderer, camera: OrbitCamera, frames: int
) -> tuple[dict[str, list[float]], list[float]]:
    """Stage timings and wall times (ms) of `frames` NV12 frames, after a warm-up."""
    for _ in range(5):
        renderer.render_frame(camera, "nv12")
    stages: dict[str, list[float]] = {}
    wall = []
    for _ in range(frames):
        camera.orbit(0.002, 0.0)
        t0 = time.perf_counter()
        renderer.render_frame(camera, "nv12")
        wall.append((time.perf_counter() - t0) * 1e3)
        for stage, ms in renderer.last_timings.items():
            stages.setdefault(stage, []).append(ms)
    return stages, wall


def wall_ms(render: Callable[[OrbitCamera], object], camera: OrbitCamera, frames: int) -> float:
    """Median wall time of `render(camera)` over `frames` calls, after a warm-up."""
    for _ in range(3):
        render(camera)
    samples = []
    for _ in range(frames):
        t0 = time.perf_counter()
        render(camera)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--cpu-frames", type=int, default=30)
    parser.add_argument("--resolutions", default="1920x1080,3840x2160")
    args = parser.parse_args()
    frames = max(args.frames, 200)

    scenes: dict[str, Scene] = {"default": default_scene()}
    try:
        probe = CudaRenderer(scenes["default"], 64, 36)
    except CudaUnavailable as exc:
        print(f"no CUDA renderer here: {exc}", file=sys.stderr)
        return 2
    device = probe.device_name
    probe.close()
    t0 = time.perf_counter()
    scenes["1M"] = sphere_field()
    print(f"device: {device}")
    print(f"scenes: default {scenes['default'].triangle_count} triangles, "
          f"1M {scenes['1M'].triangle_count} triangles (built in "
          f"{time.perf_counter() - t0:.1f} s); {frames} NV12 frames per row\n")  # fmt: skip

    header = f"{'scene':<8} {'size':>9}  {'stage':<9} {'median ms':>9} {'p95 ms':>7}"
    print(header)
    cuda_1080_rgb = None
    for size in args.resolutions.split(","):
        width, height = (int(v) for v in size.lower().split("x"))
        for name, scene in scenes.items():
            camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
            with CudaRenderer(scene, width, height) as renderer:
                stages, wall = frames_of(renderer, camera, frames)
                device_ms = wall_ms(renderer.render_device_frame, camera, frames)
                if name == "default" and (width, height) == (1920, 1080):
                    cuda_1080_rgb = wall_ms(renderer.render, camera, frames)
            for stage, values in stages.items():
                median, p95 = median_p95(values)
                print(f"{name:<8} {size:>9}  {stage:<9} {median:9.3f} {p95:7.3f}")
            median, p95 = median_p95(wall)
            print(
                f"{name:<8} {size:>9}  {'wall':<9} {median:9.3f} {p95:7.3f}"
                f"   → {1000 / median:.0f} fps end to end"
            )
            print(
                f"{name:<8} {size:>9}  {'device':<9} {device_ms:9.3f}"
                f"           (no host copy: {device_ms / median:.2f} × the wall above)\n"
            )

    scene = scenes["default"]
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    cpu_ms = wall_ms(CpuRenderer(scene, 1920, 1080).render, camera, args.cpu_frames)
    if cuda_1080_rgb is None:
        with CudaRenderer(scene, 1920, 1080) as renderer:
            cuda_1080_rgb = wall_ms(renderer.render, camera, frames)
    print("default scene at 1920x1080, render() to an RGB host frame, median wall time:")
    print(f"  CPU renderer ({DEFAULT_BANDS} bands, {args.cpu_frames} frames)  {cpu_ms:9.2f} ms")
    print(f"  CUDA renderer ({frames} frames)            {cuda_1080_rgb:9.3f} ms")
    print(f"  CPU / CUDA                               {cpu_ms / cuda_1080_rgb:9.1f} ×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
