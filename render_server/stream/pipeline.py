"""One session's frame pipeline: picture (render, convert) → encode, on the session's thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import av

from render_server.config import Resolution
from render_server.cpu_time import thread_cpu_seconds
from render_server.encode.protocol import EncodedPacket, Encoder
from render_server.protocol.timing import now_ms
from render_server.render.camera import OrbitCamera
from render_server.render.scene import Scene
from render_server.stream.keyframes import KeyframeGate
from render_server.stream.pictures import PictureSource

log = logging.getLogger(__name__)

# (size, frame rate, the session's scene or None for the worker's, RTP codec) → a picture source
# and an encoder of that size and codec
PipelineFactory = Callable[[Resolution, float, Scene | None, str], tuple[PictureSource, Encoder]]


@dataclass
class FrameTiming:
    """The last frame: milliseconds per stage (none when the picture was reused), its size."""

    stages: dict[str, float] = field(default_factory=dict)
    encode_ms: float = 0.0
    bytes: int = 0
    keyframe: bool = False
    reused: bool = False
    bitrate: int = 0
    pts: int = 0  # the presentation time the frame was given to the encoder with
    # the worker's monotonic clock, ms: the frame's start, render (and convert) end, encode end
    start_ms: float = 0.0
    rendered_ms: float = 0.0
    encoded_ms: float = 0.0


class FramePipeline:
    """Turns camera snapshots into encoded access units.

    `produce` runs on the session's one thread. Requests come from the event loop and are
    applied at the next frame: a bitrate (a receiver's estimate) and its cap, a keyframe, an
    edited scene, and a new size, frame rate or codec, for which the pipeline closes its
    picture source and encoder and builds new ones through `factory` (the first frame of the
    new encoder is an IDR). Should that fail, the stream goes on as it was.
    """

    def __init__(
        self,
        pictures: PictureSource,
        encoder: Encoder,
        keyframe_min_interval_s: float,
        factory: PipelineFactory | None = None,
        fps: float = 30.0,
    ) -> None:
        self.pictures = pictures
        self.fps = fps  # what the encoder was built for (a rebuild builds the same)
        self.encoder = encoder
        self.keyframes = KeyframeGate(keyframe_min_interval_s)
        self.last = FrameTiming()
        self.factory = factory
        self.format_errors = 0  # new formats that could not be built
        # the session thread that produces frames (its CPU time is read from /proc once a
        # second: a per-frame clock read costs ~35 µs in a VM)
        self.thread_id: int | None = None
        self._picture: av.VideoFrame | None = None
        self._picture_state: tuple[object, ...] | None = None
        self._scene: Scene | None = None  # the session's own scene, once edited
        self._lock = threading.Lock()
        self._bitrate_changed = False
        self._estimate: int | None = None
        self._cap: int | None = None
        self._wanted_scene: Callable[[], Scene] | None = None
        self._wanted_format: tuple[Resolution, float] | None = None
        self._rebuild = False
        self.rebuilds = 0  # times the stages were built afresh after a failure

    def request_bitrate(self, bitrate: int) -> None:
        """Aim the encoder at `bitrate` (a receiver's estimate) from the next frame on."""
        with self._lock:
            self._estimate = bitrate
            self._bitrate_changed = True

    def request_bitrate_cap(self, cap: int | None) -> None:
        """Never aim above `cap` bits per second, whatever the receiver estimates (None: no cap
        below the encoder's configured bitrate)."""
        with self._lock:
            self._cap = cap
            self._bitrate_changed = True

    def request_scene(self, build: Callable[[], Scene]) -> None:
        """Draw the scene `build` makes from the next frame on; it is called on this thread."""
        with self._lock:
            self._wanted_scene = build

    def request_format(self, resolution: Resolution, fps: float) -> None:
        """Pictures of `resolution` encoded for `fps` from the next frame on."""
        if self.factory is None:
            raise RuntimeError("this pipeline has no factory to change its format with")
        with self._lock:
            self._wanted_format = (resolution, fps)

    @property
    def codec(self) -> str:
        """The RTP codec the frames are encoded in."""
        return self.encoder.codec

    def set_codec(self, codec: str) -> None:
        """Encode in `codec` (an RTP name, "VP8") from the next frame on: the codec a
        browser's offer settled on. Runs on the session's thread, between frames: the stages
        are built afresh now (unless it is the codec already sent), so that an encoder that
        cannot open fails the offer, not a frame; raises what the factory raises."""
        if codec == self.encoder.codec:
            return
        if self.factory is None:
            raise RuntimeError("this pipeline has no factory to change its codec with")
        resolution = Resolution(self.encoder.width, self.encoder.height)
        self._swap(*self.factory(resolution, self.fps, self._scene, codec), self.fps)
        with self._lock:
            self._bitrate_changed = True  # the estimate and cap apply to the new encoder too
        self.keyframes.request()  # its first frame is one: counted as such

    def request_rebuild(self) -> None:
        """A frame failed (an encoder error, a CUDA error): build the picture source and the
        encoder afresh from the factory, at the size and scene they had, before the next frame,
        which is then a keyframe. Without a factory, only the keyframe."""
        with self._lock:
            self._rebuild = self.factory is not None
        self.keyframes.request()

    @property
    def cheap(self) -> bool:
        """Frames cost next to nothing (a replayed clip): the event loop may produce them
        itself instead of handing them to the session's thread."""
        with self._lock:
            reformat = self._wanted_format is not None  # a new clip takes seconds to build
        replay = getattr(self.encoder, "codec_name", "") == "replay"
        return replay and not reformat

    def is_still(self, camera: OrbitCamera) -> bool:
        """True when the next frame would repeat the last picture with nothing else to do."""
        with self._lock:
            pending = (
                self._wanted_scene is not None or self._wanted_format is not None or self._rebuild
            )
        return (
            not pending
            and self._picture is not None
            and camera.state() == self._picture_state
            and not self.keyframes.pending
        )

    def produce(self, camera: OrbitCamera, pts: int) -> EncodedPacket | None:
        if self.thread_id is None and not self.cheap:
            self.thread_id = threading.get_native_id()
        timing = FrameTiming(start_ms=now_ms())
        with self._lock:
            wanted_scene, self._wanted_scene = self._wanted_scene, None
            wanted_format, self._wanted_format = self._wanted_format, None
            retarget, self._bitrate_changed = self._bitrate_changed, False
            target = min(self._estimate or 2**31, self._cap or 2**31)
            rebuild, self._rebuild = self._rebuild, False
        fresh_encoder = False
        if rebuild:
            self._rebuild_stages()
            fresh_encoder = retarget = True
        if wanted_scene is not None:
            self._scene = wanted_scene()
            if wanted_format is None:
                self.pictures.set_scene(self._scene)
            self._picture = None
        if wanted_format is not None:
            fresh_encoder = self._reformat(*wanted_format)
            retarget = retarget or fresh_encoder
        state = camera.state()
        if self._picture is None or state != self._picture_state:
            self._picture = self.pictures.picture(camera)
            self._picture_state = state
            timing.stages = dict(self.pictures.stage_ms)
        else:
            timing.reused = True  # a still camera gives the same pixels: skip render and convert
        timing.rendered_ms = now_ms()
        if retarget:
            self.encoder.set_bitrate(target)  # the encoder caps it at its configured bitrate
        timing.bitrate = self.encoder.bitrate
        timing.keyframe = self.keyframes.take(time.monotonic()) or fresh_encoder
        timing.pts = pts
        t0 = time.perf_counter()
        packet = self.encoder.encode(self._picture, pts, keyframe=timing.keyframe)
        timing.encode_ms = (time.perf_counter() - t0) * 1e3
        timing.encoded_ms = now_ms()
        timing.bytes = packet.size if packet is not None else 0
        self.last = timing
        return packet

    def _reformat(self, resolution: Resolution, fps: float) -> bool:
        """Replace the picture source and encoder; False (and the old ones kept) on failure."""
        assert self.factory is not None
        codec = self.encoder.codec
        try:
            pictures, encoder = self.factory(resolution, fps, self._scene, codec)
        except Exception as exc:  # NVENC out of sessions, a GPU out of memory, ...
            self.format_errors += 1
            reason = {"size": str(resolution), "codec": codec, "error": str(exc)}
            log.warning("pipeline.format_failed", extra=reason)
            if self._scene is not None:
                self.pictures.set_scene(self._scene)
            return False
        self._swap(pictures, encoder, fps)
        return True

    def _rebuild_stages(self) -> None:
        """New stages of the current size from the factory, after a failed frame; the
        factory's error, if any, is the caller's."""
        assert self.factory is not None
        resolution = Resolution(self.encoder.width, self.encoder.height)
        self._swap(*self.factory(resolution, self.fps, self._scene, self.encoder.codec), self.fps)
        self.rebuilds += 1

    def _swap(self, pictures: PictureSource, encoder: Encoder, fps: float) -> None:
        """Put new stages in place of the old ones, which are closed (a broken stage may fail
        to close: that is logged, not raised)."""
        for stage in (self.encoder, self.pictures):
            try:
                stage.close()
            except Exception as exc:
                log.warning("pipeline.close_failed", extra={"error": str(exc)[:200]})
        self.pictures, self.encoder, self.fps = pictures, encoder, fps
        self._picture = None

    def cpu_seconds(self) -> float | None:
        """CPU time of the frame thread so far (None before it ran, or where /proc is not)."""
        return None if self.thread_id is None else thread_cpu_seconds(self.thread_id)

    def close(self) -> None:
        self.encoder.close()
        self.pictures.close()
