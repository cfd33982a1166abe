"""Slower pipeline stages, for tests that need a worker that cannot keep up or a known delay in
one stage: a picture source and an encoder that sleep, wrapped around the real ones by the
worker's factory (`LocalWorker.build_stages`)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import av

from render_server.config import Resolution
from render_server.encode.protocol import EncodedPacket, Encoder
from render_server.render.camera import OrbitCamera
from render_server.render.scene import Scene
from render_server.stream.pictures import PictureSource
from render_server.worker.local import LocalWorker

BuildStages = Callable[
    [LocalWorker, Resolution, float, Scene | None, str], tuple[PictureSource, Encoder]
]


class SlowPictures:
    """A `PictureSource` whose every picture takes `delay_s` longer: the render stage grows by
    that much whenever a picture is drawn (a reused picture costs nothing, as it does really)."""

    def __init__(self, inner: PictureSource, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.pix_fmt = inner.pix_fmt
        self.stage_ms = inner.stage_ms

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        time.sleep(self.delay_s)
        frame = self.inner.picture(camera)
        self.stage_ms = self.inner.stage_ms
        return frame

    def set_scene(self, scene: Scene) -> None:
        self.inner.set_scene(scene)

    def close(self) -> None:
        self.inner.close()


class SlowEncoder:
    """An `Encoder` whose every frame takes `delay_s` longer: the encode stage grows by that
    much on every frame sent. With `lag_frames`, it hands back each packet that many frames
    late, as an encoder with a lookahead does (None until it has held that many)."""

    def __init__(self, inner: Encoder, delay_s: float, lag_frames: int = 0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.lag_frames = lag_frames
        self._held: deque[EncodedPacket | None] = deque()
        self.codec = inner.codec
        # never "replay": the pipeline produces a replayed clip's frames on the event loop,
        # which a sleeping stage would stall
        self.codec_name = f"slow {inner.codec_name}"
        self.width = inner.width
        self.height = inner.height
        self.pix_fmt = inner.pix_fmt

    @property
    def bitrate(self) -> int:
        return self.inner.bitrate

    def set_bitrate(self, bitrate: int) -> int:
        return self.inner.set_bitrate(bitrate)

    def encode(
        self, frame: av.VideoFrame, pts: int, keyframe: bool = False
    ) -> EncodedPacket | None:
        packet = self.inner.encode(frame, pts, keyframe)
        time.sleep(self.delay_s)
        self._held.append(packet)
        return self._held.popleft() if len(self._held) > self.lag_frames else None

    def close(self) -> None:
        self.inner.close()


def slowed(
    build: BuildStages, render_s: float = 0.0, encode_s: float = 0.0, lag_frames: int = 0
) -> BuildStages:
    """`build` (a `LocalWorker.build_stages`) with its stages slowed down (or its encoder
    lagging): for
    `monkeypatch.setattr(LocalWorker, "build_stages", slowed(LocalWorker.build_stages, ...))`."""

    def build_slow_stages(
        worker: LocalWorker,
        resolution: Resolution,
        fps: float,
        scene: Scene | None,
        codec: str = "H264",
    ) -> tuple[PictureSource, Encoder]:
        pictures, encoder = build(worker, resolution, fps, scene, codec)
        return SlowPictures(pictures, render_s), SlowEncoder(encoder, encode_s, lag_frames)

    return build_slow_stages
