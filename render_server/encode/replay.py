"""`--encoder replay`: a pre-encoded clip sent in a loop, for load tests without a GPU.

Rendering and encoding 4K at 60 fps for twenty streams is far beyond a CPU, yet the transport,
the signaling and the load-test harness need loading at that size. The worker renders and
encodes one short clip per (size, rate, bitrate) once, with the real renderer and libx264, and
every session then replays its access units in a loop with fresh timestamps: the packet path
is exactly the real one, the per-frame cost is nearly nothing.

The clip opens with an IDR and holds no other, so its start is the loop point and the answer to
a keyframe request. It is real video: a camera orbiting the scene, at the bitrate asked for.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from render_server.config import Resolution
from render_server.encode.convert import YuvConverter
from render_server.encode.protocol import EncodedPacket
from render_server.encode.x264 import create_x264_encoder
from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.scene import Scene

RTP_TIME_BASE = 90_000
RTP_TIME_UNIT = Fraction(1, RTP_TIME_BASE)  # made once: a Fraction per frame shows in profiles
CLIP_SECONDS = 2.0
ORBIT_PER_S = 0.6  # radians: enough motion for the encoder to spend its bitrate


@dataclass(frozen=True)
class ReplayClip:
    resolution: Resolution
    fps: float
    bitrate: int
    units: tuple[bytes, ...]  # access units, Annex B; units[0] is an IDR with SPS/PPS

    @property
    def bytes_per_loop(self) -> int:
        return sum(len(u) for u in self.units)


_clips: dict[tuple[Resolution, float, int], ReplayClip] = {}
_clips_lock = threading.Lock()


def replay_clip(scene: Scene, resolution: Resolution, fps: float, bitrate: int) -> ReplayClip:
    """The clip for this size, rate and bitrate, built once per process (the lock makes the
    other sessions wait for the first one's build instead of building it again)."""
    key = (resolution, fps, bitrate)
    with _clips_lock:
        clip = _clips.get(key)
        if clip is None:
            clip = _clips[key] = _build_clip(scene, resolution, fps, bitrate)
        return clip


def _build_clip(scene: Scene, resolution: Resolution, fps: float, bitrate: int) -> ReplayClip:
    width, height = resolution.width, resolution.height
    renderer = CpuRenderer(scene, width, height)
    converter = YuvConverter(width, height)
    encoder = create_x264_encoder(resolution, fps, bitrate)
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    count = max(2, round(CLIP_SECONDS * fps))
    step = ORBIT_PER_S / fps
    units: list[bytes] = []
    try:
        for i in range(count):
            # a closed loop: the last frame leads back into the first
            camera.yaw = camera.yaw + step if i else camera.yaw
            camera.pitch = 0.25 + 0.1 * math.sin(2 * math.pi * i / count)
            frame = converter.convert(renderer.render(camera))
            packet = encoder.encode(frame, int(i * RTP_TIME_BASE / fps), keyframe=i == 0)
            if packet is None:
                raise RuntimeError("libx264 held a frame back: the clip needs zerolatency")
            units.append(bytes(packet))
    finally:
        encoder.close()
    return ReplayClip(resolution, fps, bitrate, tuple(units))


class ReplayEncoder:
    """The `Encoder` protocol over a clip: each call returns the next access unit."""

    codec = "H264"
    codec_name = "replay"
    pix_fmt = "yuv420p"

    def __init__(self, clip: ReplayClip) -> None:
        self.clip = clip
        self.width = clip.resolution.width
        self.height = clip.resolution.height
        self._next = 0
        self.loops = 0

    @property
    def bitrate(self) -> int:
        return self.clip.bitrate

    def set_bitrate(self, bitrate: int) -> int:
        return self.clip.bitrate  # a recording cannot follow the receiver's estimate

    def encode(self, frame: av.VideoFrame, pts: int, keyframe: bool = False) -> EncodedPacket:
        if keyframe or self._next >= len(self.clip.units):
            if self._next:
                self.loops += 1
            self._next = 0
        unit = self.clip.units[self._next]
        packet = av.Packet(unit)
        packet.pts = packet.dts = pts
        packet.time_base = RTP_TIME_UNIT
        packet.is_keyframe = self._next == 0
        self._next += 1
        return packet

    def close(self) -> None:
        pass


class ReplayPictures:
    """No pictures at all: the clip is the picture. A tiny frame keeps the pipeline's shape."""

    pix_fmt = "yuv420p"

    def __init__(self) -> None:
        self.stage_ms: dict[str, float] = {}
        self._frame = av.VideoFrame.from_ndarray(np.zeros((2, 2, 3), np.uint8), format="rgb24")

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        return self._frame

    def set_scene(self, scene: Scene) -> None:
        pass  # the clip was rendered once; scene commands do not change a recording

    def close(self) -> None:
        pass
