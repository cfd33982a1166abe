"""The worker embedded in `render-server serve`: sessions rendered and encoded in this process."""

from __future__ import annotations

import logging
import os
import platform
import time
from typing import Any

from ..config import StreamConfig
from ..encode.x264 import create_x264_encoder
from ..metrics import Metrics
from ..render.camera import OrbitCamera
from ..render.cpu import CpuRenderer
from ..render.scene import Scene
from ..signaling.workers import SessionEndCallback
from .controls import CameraController
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
    ) -> None:
        self.worker_id = worker_id
        self.scene = scene
        self.stream = stream
        self.slots = slots
        self.metrics = metrics
        self.ice_servers = ice_servers
        self.initial_camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)

    @property
    def capabilities(self) -> dict[str, Any]:
        return {
            "renderer": self.stream.renderer,
            "encoders": [self.stream.encoder],
            "codec": "H264",
            "resolution": str(self.stream.resolution),
            "fps": self.stream.fps,
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "triangles": self.scene.triangle_count,
        }

    def warm_up(self) -> float:
        """Compile the renderer and open an encoder once, so the first session starts at once."""
        t0 = time.perf_counter()
        pipeline = self._pipeline()
        pipeline.produce(self.initial_camera.copy(), 0)
        pipeline.close()
        return time.perf_counter() - t0

    def open_session(self, session_id: str, on_end: SessionEndCallback) -> StreamSession:
        return StreamSession(
            session_id,
            self._pipeline(),
            CameraController(self.initial_camera.copy(), animate=self.stream.animate),
            self.stream.fps,
            self.stream.connect_timeout_s,
            self.ice_servers,
            self.metrics,
            on_end,
        )

    def _pipeline(self) -> FramePipeline:
        res = self.stream.resolution
        renderer = CpuRenderer(self.scene, res.width, res.height)
        encoder = create_x264_encoder(res, self.stream.fps, self.stream.target_bitrate)
        return FramePipeline(renderer, encoder, self.stream.keyframe_min_interval_s)
