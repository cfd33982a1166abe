"""One session's frame pipeline: picture (render, convert) → encode, on the session's thread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import av

from ..encode.protocol import Encoder
from ..render.camera import OrbitCamera
from .keyframes import KeyframeGate
from .pictures import PictureSource


@dataclass
class FrameTiming:
    """The last frame: milliseconds per stage (none when the picture was reused), its size."""

    stages: dict[str, float] = field(default_factory=dict)
    encode_ms: float = 0.0
    bytes: int = 0
    keyframe: bool = False
    reused: bool = False
    bitrate: int = 0


class FramePipeline:
    """Turns camera snapshots into encoded access units.

    `produce` runs on the session's one thread; `request_bitrate` and keyframe requests come
    from the event loop and are applied at the next frame.
    """

    def __init__(
        self, pictures: PictureSource, encoder: Encoder, keyframe_min_interval_s: float
    ) -> None:
        self.pictures = pictures
        self.encoder = encoder
        self.keyframes = KeyframeGate(keyframe_min_interval_s)
        self.last = FrameTiming()
        self._picture: av.VideoFrame | None = None
        self._picture_state: tuple[object, ...] | None = None
        self._bitrate_lock = threading.Lock()
        self._wanted_bitrate: int | None = None

    def request_bitrate(self, bitrate: int) -> None:
        """Aim the encoder at `bitrate` (a receiver's estimate) from the next frame on."""
        with self._bitrate_lock:
            self._wanted_bitrate = bitrate

    def produce(self, camera: OrbitCamera, pts: int) -> av.Packet | None:
        timing = FrameTiming()
        state = camera.state()
        if self._picture is None or state != self._picture_state:
            self._picture = self.pictures.picture(camera)
            self._picture_state = state
            timing.stages = dict(self.pictures.stage_ms)
        else:
            timing.reused = True  # a still camera gives the same pixels: skip render and convert
        with self._bitrate_lock:
            wanted, self._wanted_bitrate = self._wanted_bitrate, None
        if wanted is not None:
            self.encoder.set_bitrate(wanted)
        timing.bitrate = self.encoder.bitrate
        timing.keyframe = self.keyframes.take(time.monotonic())
        t0 = time.perf_counter()
        packet = self.encoder.encode(self._picture, pts, keyframe=timing.keyframe)
        timing.encode_ms = (time.perf_counter() - t0) * 1e3
        timing.bytes = packet.size if packet is not None else 0
        self.last = timing
        return packet

    def close(self) -> None:
        self.encoder.close()
        self.pictures.close()
