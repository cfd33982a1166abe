"""A worker's sessions, built in this process: picture source, encoder and stream session per
browser, for `serve`'s embedded worker and `render-server worker` alike."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from render_server.backends.choice import Backends
from render_server.backends.gpu import explain_nvenc_failure
from render_server.config import Resolution, StreamConfig
from render_server.encode.av1 import create_svtav1_encoder
from render_server.encode.codecs import sendable
from render_server.encode.h264_bitstream import start_codes
from render_server.encode.nvenc import NVENC_NAMES, create_nvenc_encoder
from render_server.encode.protocol import Encoder
from render_server.encode.replay import ReplayEncoder, ReplayPictures, replay_clip
from render_server.encode.vp8 import create_vp8_encoder
from render_server.encode.x264 import create_x264_encoder
from render_server.metrics import Metrics
from render_server.protocol.signaling import IceServer
from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.scene import Scene
from render_server.stream.controls import CameraController
from render_server.stream.pictures import (
    CpuPictures,
    CudaPictures,
    PictureSource,
    device_scene,
    nvenc_on_device,
)
from render_server.stream.pipeline import FramePipeline
from render_server.stream.quality import QualityLimits
from render_server.stream.scene_commands import SceneCommands
from render_server.stream.scene_fetch import SceneFetcher
from render_server.stream.scene_loading import SceneLoading
from render_server.stream.session import SessionEndCallback, StreamSession
from render_server.stream.state import read_state, restored_quality
from render_server.transport import check_aiortc_version

log = logging.getLogger(__name__)


class LocalWorker:
    """Opens sessions that render and encode in this process.

    `build_stages` is the pipeline's factory: every picture source and encoder a session
    uses, at the start and at each new size, comes from it.
    """

    def __init__(
        self,
        worker_id: str,
        scene: Scene,
        stream: StreamConfig,
        slots: int,
        metrics: Metrics,
        ice_servers: tuple[str, ...] = (),
        backends: Backends | None = None,
        scene_fetcher: SceneFetcher | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.scene_fetcher = scene_fetcher  # uploaded scenes (loadScene); None: refused
        self.scene = scene
        self.stream = stream
        self.slots = slots
        self.metrics = metrics
        self.ice_servers = ice_servers
        self.backends = backends or Backends("cpu", "x264", "default", "default", "x264")
        self.initial_camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
        self._device_frames_opened = False  # NVENC has opened on frames in GPU memory here

    @property
    def codecs(self) -> tuple[str, ...]:
        """What this worker's sessions may be sent in, its preferred first: the codecs asked
        for (`--codecs`) that an encoder here makes (a replayed clip is H.264 only)."""
        return sendable(self.stream.codecs, self.backends.codec_encoders)

    @property
    def capabilities(self) -> dict[str, Any]:
        gpu = self.backends.gpu
        return {
            "renderer": self.backends.renderer,
            "encoder": self.backends.encoder,
            "encoders": sorted({self.backends.encoder, "x264"}),
            # frames from the CUDA renderer to NVENC without leaving GPU memory
            "gpu_frames": self.backends.device_frames,
            "codecs": list(self.codecs),
            "gpu": gpu.name if gpu else None,
            "gpu_memory_mib": gpu.memory_mib if gpu else None,
            "resolution": str(self.stream.resolution),
            "fps": self.stream.fps,
            "slots": self.slots,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "triangles": self.scene.triangle_count,
        }

    def warm_up(self) -> float:
        """Compile the renderer and the packer's scan and open an encoder once, so the first
        session starts at once.

        With `--renderer auto`, a CUDA renderer that fails here (kernels that do not compile
        for this GPU, say) falls back to the CPU renderer with a log line.
        """
        t0 = time.perf_counter()
        if self.stream.intra_refresh and self.backends.encoder != "nvenc":
            # said, not refused: one configuration for a fleet of GPU and CPU workers
            log.warning(
                "encoder.intra_refresh_ignored",
                extra={"encoder": self.backends.encoder,
                       "reason": "intra refresh is NVENC's: this encoder sends keyframes"},
            )  # fmt: skip
        try:
            pipeline = self._pipeline()
        except Exception as exc:
            if self.backends.renderer != "cuda" or self.stream.renderer == "cuda":
                raise
            reason = f"the CUDA renderer did not start: {exc}"
            log.warning("backend.fallback", extra={"stage": "renderer", "reason": reason})
            self.backends = replace(self.backends, renderer="cpu", renderer_reason=reason)
            pipeline = self._pipeline()
        pipeline.produce(self.initial_camera.copy(), 0)
        pipeline.close()
        start_codes(b"\x00\x00\x01\x65")  # the H.264 packer's scan, compiled or loaded now
        return time.perf_counter() - t0

    async def open_session(
        self,
        session_id: str,
        on_end: SessionEndCallback,
        role: str = "controller",
        ice_servers: Sequence[IceServer] = (),
        state: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> StreamSession:
        """A new session; `ice_servers` (with per-session TURN credentials) replace the
        worker's own STUN list when given. `state`: another worker's `export_state` of this
        session (a move), to go on from; what of it is malformed is left out with a WARNING.
        `name`: the owner's, as the session's viewers see it (None: anonymous)."""
        # one warning in the log if aiortc is not the release the transport was checked on
        check_aiortc_version()
        restored = read_state(state, self.scene)
        limits = QualityLimits.of(self.stream)
        quality = restored_quality(restored.quality, limits, limits.initial(self.stream))
        # renderer and encoder start off the event loop: a CUDA renderer loads its kernels and
        # allocates device buffers, an NVENC encoder opens a session on the GPU
        pipeline = await asyncio.get_running_loop().run_in_executor(
            None, self._pipeline, quality.resolution, quality.fps
        )
        if quality.max_kbps < limits.max_kbps:
            pipeline.request_bitrate_cap(quality.max_kbps * 1000)
        servers = list(ice_servers) or [IceServer(urls=[url]) for url in self.ice_servers]
        controller = CameraController(self.initial_camera.copy(), animate=self.stream.animate)
        if restored.camera is not None:
            restored.camera.apply(controller.camera)
        commands = SceneCommands(self.scene, controller, pipeline.request_scene)
        commands.restore(restored.edits)
        session = StreamSession(
            session_id,
            pipeline,
            controller,
            quality.fps,
            self.stream.connect_timeout_s,
            servers,
            self.metrics,
            on_end,
            role=role,
            idle_timeout_s=self.stream.idle_timeout_s,
            commands=commands,
            quality=quality,
            quality_limits=limits,
            # a replayed clip moves on every frame: it never stands still
            idle_fps=self.stream.fps if self.backends.encoder == "replay" else self.stream.idle_fps,
            playout_delay=self.stream.playout_delay,
            send_path=self.stream.send_path,
            congestion_record_dir=self.stream.congestion_record_dir,
            fec=self.stream.fec,
            fec_copies=self.stream.fec_copies,
            codecs=self.codecs,
            max_viewers=self.stream.max_viewers,
            owner_name=name,
        )
        if self.scene_fetcher is not None:
            loading = SceneLoading(
                self.scene_fetcher, commands.replace_base, session.input.send, self.metrics,
                prepare=self.backends.renderer == "cpu",
            )  # fmt: skip
            commands.loader = loading.start
            session.scene_loading = loading
            if restored.upload is not None:
                loading.start(restored.upload)  # a moved session shows its upload again
        return session

    def _pipeline(
        self, resolution: Resolution | None = None, fps: float | None = None
    ) -> FramePipeline:
        resolution = resolution or self.stream.resolution
        fps = fps or self.stream.fps
        # the worker's first codec until the browser's offer says which it takes
        pictures, encoder = self.build_stages(resolution, fps, None, self.codecs[0])
        return FramePipeline(
            pictures, encoder, self.stream.keyframe_min_interval_s, factory=self.build_stages,
            fps=fps,
        )  # fmt: skip

    def build_stages(
        self, resolution: Resolution, fps: float, scene: Scene | None, codec: str = "H264"
    ) -> tuple[PictureSource, Encoder]:
        """A picture source and an encoder of one size and codec, for a session's scene
        (None: the worker's)."""
        if codec not in self.codecs:
            raise ValueError(f"this worker does not send {codec} (it sends {self.codecs})")
        if self.backends.encoder == "replay":
            bitrate = self.stream.bitrate_for(resolution, fps)
            clip = replay_clip(self.scene, resolution, fps, bitrate)
            return ReplayPictures(), ReplayEncoder(clip)
        if self.backends.device_frames and codec in self.backends.nvenc_codecs:
            built = self._build_on_device(resolution, fps, scene, codec)
            if built is not None:
                return built
        encoder = self._encoder(resolution, fps, codec)
        try:
            return self._pictures(encoder.pix_fmt, resolution, scene), encoder
        except BaseException:
            encoder.close()
            raise

    def _build_on_device(
        self, resolution: Resolution, fps: float, scene: Scene | None, codec: str = "H264"
    ) -> tuple[PictureSource, Encoder] | None:
        """CUDA pictures that stay in GPU memory and an NVENC encoder opened on one; None
        where NVENC does not open on them (the caller goes through host memory instead)."""
        stream = self.stream
        pictures = self._cuda_pictures("cuda", resolution, scene or self.scene)
        try:
            encoder = nvenc_on_device(
                pictures, fps, stream.bitrate_for(resolution, fps), stream.nvenc_preset,
                stream.intra_refresh, codec=NVENC_NAMES[codec],
            )  # fmt: skip
        except Exception as exc:  # FFmpeg's CUDA device or NVENC refused: whatever the error
            if self._device_frames_opened:
                # it worked before: out of NVENC sessions or memory, not a path that cannot
                # work; this session tries host frames (and libx264 after them)
                log.warning("encoder.fallback", extra={"reason": f"NVENC on GPU frames: {exc}"})
                return None
            reason = f"NVENC did not open on frames in GPU memory ({exc}): via host memory"
            log.warning("backend.fallback", extra={"stage": "nvenc_input", "reason": reason})
            self.backends = replace(self.backends, nvenc_input="host")
            return None
        self._device_frames_opened = True
        return pictures, encoder

    def _pictures(
        self, pix_fmt: str, res: Resolution | None = None, scene: Scene | None = None
    ) -> PictureSource:
        res = res or self.stream.resolution
        scene = scene or self.scene
        if self.backends.renderer == "cuda":
            return self._cuda_pictures(pix_fmt, res, scene)
        return CpuPictures(CpuRenderer(scene, res.width, res.height))

    def _cuda_pictures(self, pix_fmt: str, res: Resolution, scene: Scene) -> CudaPictures:
        from render_server.render.cuda.renderer import CudaRenderer  # pycuda is an optional extra

        def make(scene: Scene) -> CudaRenderer:
            return CudaRenderer(scene, res.width, res.height)

        return CudaPictures(make(device_scene(scene)), pix_fmt, make)

    def _encoder(
        self, resolution: Resolution | None = None, fps: float | None = None, codec: str = "H264"
    ) -> Encoder:
        stream = self.stream
        resolution = resolution or stream.resolution
        fps = fps or stream.fps
        bitrate = stream.bitrate_for(resolution, fps)
        if self.backends.encoder == "nvenc" and codec in self.backends.nvenc_codecs:
            try:
                return create_nvenc_encoder(
                    NVENC_NAMES[codec], resolution, fps, bitrate,
                    pix_fmt=self.backends.host_pix_fmt, preset=stream.nvenc_preset,
                    intra_refresh=stream.intra_refresh,
                )  # fmt: skip
            except (OSError, RuntimeError) as exc:  # av's errors are OSError subclasses
                if self.backends.encoder_requested == "nvenc":
                    raise
                # e.g. a consumer GPU's limit on concurrent NVENC sessions: this session
                # encodes on the CPU, the next one tries NVENC again
                reason = explain_nvenc_failure([str(exc)])
                log.warning("encoder.fallback", extra={"reason": reason})
        if codec == "VP8":
            return create_vp8_encoder(resolution, fps, bitrate)
        if codec == "AV1":
            return create_svtav1_encoder(resolution, fps, bitrate)
        return create_x264_encoder(resolution, fps, bitrate)
