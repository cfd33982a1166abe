"""Short measurements of each backend, for `render-server doctor` and `render-server bench`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av

from render_server.backends.choice import Backends
from render_server.config import Resolution, default_bitrate
from render_server.encode.nvenc import create_nvenc_encoder
from render_server.encode.protocol import Encoder
from render_server.encode.x264 import create_x264_encoder
from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.scene import Scene
from render_server.stream.pictures import CpuPictures, CudaPictures, PictureSource, nvenc_on_device
from render_server.stream.pipeline import FramePipeline

STEP = 0.02  # radians of orbit per frame: every frame is a new picture


@dataclass(frozen=True)
class Measurement:
    """Median milliseconds per stage over `frames` frames, and the frame rate sustained."""

    what: str
    resolution: str
    frames: int
    fps: float
    stages_ms: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "resolution": self.resolution,
            "frames": self.frames,
            "fps": round(self.fps, 1),
            "stages_ms": {k: round(v, 2) for k, v in self.stages_ms.items()},
        }


def make_pictures(
    scene: Scene, renderer: str, resolution: Resolution, pix_fmt: str
) -> PictureSource:
    if renderer == "cuda":
        from render_server.render.cuda.renderer import CudaRenderer

        return CudaPictures(CudaRenderer(scene, resolution.width, resolution.height), pix_fmt)
    return CpuPictures(CpuRenderer(scene, resolution.width, resolution.height))


def make_encoder(
    encoder: str, resolution: Resolution, fps: float, pix_fmt: str = "nv12"
) -> Encoder:
    """libx264, or NVENC reading host frames in `pix_fmt`."""
    bitrate = default_bitrate(resolution, fps)
    if encoder == "nvenc":
        return create_nvenc_encoder("h264", resolution, fps, bitrate, pix_fmt=pix_fmt)
    return create_x264_encoder(resolution, fps, bitrate)


def _run(
    seconds: float, step: Callable[[int], dict[str, float]]
) -> tuple[int, float, dict[str, float]]:
    step(0)  # warm-up: compilation, first allocations, the first IDR
    samples: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    frames = 0
    while frames < 5 or time.perf_counter() - t0 < seconds:
        frames += 1
        for stage, ms in step(frames).items():
            samples.setdefault(stage, []).append(ms)
    elapsed = time.perf_counter() - t0
    return frames, frames / elapsed, {k: statistics.median(v) for k, v in samples.items()}


def bench_renderer(
    scene: Scene, renderer: str, resolution: Resolution, seconds: float
) -> Measurement:
    """Pictures only (render and conversion), the camera moving every frame."""
    pictures = make_pictures(scene, renderer, resolution, "yuv420p")
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)

    def step(_: int) -> dict[str, float]:
        camera.orbit(STEP, 0.0)
        pictures.picture(camera)
        return pictures.stage_ms

    try:
        frames, fps, stages = _run(seconds, step)
    finally:
        pictures.close()
    return Measurement(f"renderer {renderer}", str(resolution), frames, fps, stages)


def bench_encoder(
    scene: Scene, encoder: str, resolution: Resolution, seconds: float
) -> Measurement:
    """Encoding only, of pictures rendered beforehand on the CPU (a moving camera)."""
    enc = make_encoder(encoder, resolution, 60.0)
    pictures = CpuPictures(CpuRenderer(scene, resolution.width, resolution.height))
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    frames = []
    for _ in range(8):
        camera.orbit(STEP * 4, 0.0)
        frame = _copy(pictures.picture(camera))  # the source reuses its frame
        if frame.format.name != enc.pix_fmt:
            frame = frame.reformat(format=enc.pix_fmt)
        frames.append(frame)

    def step(i: int) -> dict[str, float]:
        t0 = time.perf_counter()
        enc.encode(frames[i % len(frames)], pts=i * 1500, keyframe=(i == 0))
        return {"encode": (time.perf_counter() - t0) * 1e3}

    try:
        count, fps, stages = _run(seconds, step)
    finally:
        enc.close()
    return Measurement(f"encoder {encoder} ({enc.codec_name})", str(resolution), count, fps, stages)


def _copy(frame: av.VideoFrame) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(frame.to_ndarray(), format=frame.format.name)


def bench_pipeline(
    scene: Scene, backends: Backends, resolution: Resolution, seconds: float
) -> Measurement:
    """The whole server-side frame path of one session: picture, encode; camera always moving.

    CUDA + NVENC runs with the frames in GPU memory where `backends.device_frames`, else
    through a copy in host memory.
    """
    pictures = make_pictures(scene, backends.renderer, resolution, backends.pix_fmt)
    enc: Encoder
    if isinstance(pictures, CudaPictures) and backends.device_frames:
        enc = nvenc_on_device(pictures, 60.0, default_bitrate(resolution, 60.0))
    else:
        try:
            enc = make_encoder(backends.encoder, resolution, 60.0, backends.host_pix_fmt)
        except BaseException:
            pictures.close()
            raise
    pipeline = FramePipeline(pictures, enc, 1.0)
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)

    def step(i: int) -> dict[str, float]:
        camera.orbit(STEP, 0.0)
        pipeline.produce(camera.copy(), pts=i * 1500)
        return {**pipeline.last.stages, "encode": pipeline.last.encode_ms}

    try:
        frames, fps, stages = _run(seconds, step)
    finally:
        pipeline.close()
    what = f"pipeline {backends.renderer}+{backends.encoder}"
    if backends.renderer == "cuda" and backends.encoder == "nvenc":
        what += " (device frames)" if backends.device_frames else " (host frames)"
    return Measurement(what, str(resolution), frames, fps, stages)
