"""The worker embedded in `render-server serve`: sessions rendered and encoded in this process."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..backends import Backends
from ..config import StreamConfig
from ..encode.nvenc import create_nvenc_encoder
from ..encode.protocol import Encoder
from ..encode.x264 import create_x264_encoder
from ..gpu import explain_nvenc_failure
from ..metrics import Metrics
from ..render.camera import OrbitCamera
from ..render.cpu import CpuRenderer
from ..render.scene import Scene
from ..signaling.messages import IceServer
from ..signaling.workers import SessionEndCallback
from .controls import CameraController
from .pictures import CpuPictures, CudaPictures, PictureSource
from .pipeline import FramePipeline
from .session import StreamSession

log = logging.getLogger(__name__)


class LocalWorker:
    def __init__(
        self,
        worker_id: str,
        scene: Scene,
        stream: StreamConfig,
        slots: int,
        metrics: Metrics,
        ice_servers: tuple[str, ...] = (),
        backends: Backends | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.scene = scene
        self.stream = stream
        self.slots = slots
        self.metrics = metrics
        self.ice_servers = ice_servers
        self.backends = backends or Backends("cpu", "x264", "default", "default", "x264")
        self.initial_camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)

    @property
    def capabilities(self) -> dict[str, Any]:
        gpu = self.backends.gpu
        return {
            "renderer": self.backends.renderer,
            "encoder": self.backends.encoder,
            "encoders": sorted({self.backends.encoder, "x264"}),
            "codecs": ["H264"],
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
        """Compile the renderer and open an encoder once, so the first session starts at once.

        With `--renderer auto`, a CUDA renderer that fails here (kernels that do not compile
        for this GPU, say) falls back to the CPU renderer with a log line.
        """
        t0 = time.perf_counter()
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
        return time.perf_counter() - t0

    async def open_session(
        self,
        session_id: str,
        on_end: SessionEndCallback,
        role: str = "controller",
        ice_servers: Sequence[IceServer] = (),
    ) -> StreamSession:
        """A new session; `ice_servers` (with per-session TURN credentials) replace the
        worker's own STUN list when given."""
        # renderer and encoder start off the event loop: a CUDA renderer loads its kernels and
        # allocates device buffers, an NVENC encoder opens a session on the GPU
        pipeline = await asyncio.get_running_loop().run_in_executor(None, self._pipeline)
        servers = list(ice_servers) or [IceServer(urls=[url]) for url in self.ice_servers]
        return StreamSession(
            session_id,
            pipeline,
            CameraController(self.initial_camera.copy(), animate=self.stream.animate),
            self.stream.fps,
            self.stream.connect_timeout_s,
            servers,
            self.metrics,
            on_end,
            role=role,
            idle_timeout_s=self.stream.idle_timeout_s,
        )

    def _pipeline(self) -> FramePipeline:
        encoder = self._encoder()
        return FramePipeline(
            self._pictures(encoder.pix_fmt), encoder, self.stream.keyframe_min_interval_s
        )

    def _pictures(self, pix_fmt: str) -> PictureSource:
        res = self.stream.resolution
        if self.backends.renderer == "cuda":
            from ..render.cuda import CudaRenderer  # pycuda is an optional extra

            return CudaPictures(CudaRenderer(self.scene, res.width, res.height), pix_fmt)
        return CpuPictures(CpuRenderer(self.scene, res.width, res.height))

    def _encoder(self) -> Encoder:
        stream = self.stream
        if self.backends.encoder == "nvenc":
            try:
                return create_nvenc_encoder(
                    "h264", stream.resolution, stream.fps, stream.target_bitrate,
                    pix_fmt=self.backends.pix_fmt, preset=stream.nvenc_preset,
                    intra_refresh=stream.intra_refresh,
                )  # fmt: skip
            except (OSError, RuntimeError) as exc:  # av's errors are OSError subclasses
                if self.backends.encoder_requested == "nvenc":
                    raise
                # e.g. a consumer GPU's limit on concurrent NVENC sessions: this session
                # encodes on the CPU, the next one tries NVENC again
                reason = explain_nvenc_failure([str(exc)])
                log.warning("encoder.fallback", extra={"reason": reason})
        return create_x264_encoder(stream.resolution, stream.fps, stream.target_bitrate)
