"""One session's frame pipeline: render → convert → encode, run on the session's own thread."""

from __future__ import annotations

import time
from dataclasses import dataclass

import av

from ..encode.convert import YuvConverter
from ..encode.protocol import Encoder
from ..render.camera import OrbitCamera
from ..render.protocol import Renderer
from .keyframes import KeyframeGate


@dataclass
class FrameTiming:
    """Milliseconds spent on the last frame; render/convert are 0 when the picture was reused."""

    render_ms: float = 0.0
    convert_ms: float = 0.0
    encode_ms: float = 0.0
    bytes: int = 0
    keyframe: bool = False
    reused: bool = False


class FramePipeline:
    """Turns camera snapshots into encoded access units; not thread-safe: one caller thread."""

    def __init__(
        self, renderer: Renderer, encoder: Encoder, keyframe_min_interval_s: float
    ) -> None:
        self.renderer = renderer
        self.encoder = encoder
        self.keyframes = KeyframeGate(keyframe_min_interval_s)
        self.last = FrameTiming()
        self._converter = YuvConverter(renderer.width, renderer.height)
        self._picture: av.VideoFrame | None = None
        self._picture_state: tuple[object, ...] | None = None

    def produce(self, camera: OrbitCamera, pts: int) -> av.Packet | None:
        timing = FrameTiming()
        state = camera.state()
        if self._picture is None or state != self._picture_state:
            t0 = time.perf_counter()
            rgb = self.renderer.render(camera)
            t1 = time.perf_counter()
            self._picture = self._converter.convert(rgb)
            self._picture_state = state
            t2 = time.perf_counter()
            timing.render_ms, timing.convert_ms = (t1 - t0) * 1e3, (t2 - t1) * 1e3
        else:
            timing.reused = True  # a still camera gives the same pixels: skip render and convert
        timing.keyframe = self.keyframes.take(time.monotonic())
        t3 = time.perf_counter()
        packet = self.encoder.encode(self._picture, pts, keyframe=timing.keyframe)
        timing.encode_ms = (time.perf_counter() - t3) * 1e3
        timing.bytes = packet.size if packet is not None else 0
        self.last = timing
        return packet

    def close(self) -> None:
        self.encoder.close()
