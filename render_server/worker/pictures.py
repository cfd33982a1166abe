"""Where a session's pictures come from: a renderer plus whatever makes its output encodable."""

from __future__ import annotations

import time
from typing import Any, Protocol

import av

from ..encode.convert import YuvConverter
from ..render.camera import OrbitCamera
from ..render.protocol import Renderer


class PictureSource(Protocol):
    """Encoder-ready pictures for a camera; `stage_ms` holds the last picture's stage times."""

    pix_fmt: str
    stage_ms: dict[str, float]

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        """The picture for `camera`; the frame object may be reused by the next call."""
        ...

    def close(self) -> None: ...


class CpuPictures:
    """CPU renderer → RGB → BT.709 4:2:0 in one reused frame (libx264 and NVENC both read it)."""

    pix_fmt = "yuv420p"

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self.converter = YuvConverter(renderer.width, renderer.height)
        self.stage_ms: dict[str, float] = {}

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        t0 = time.perf_counter()
        rgb = self.renderer.render(camera)
        t1 = time.perf_counter()
        frame = self.converter.convert(rgb)
        t2 = time.perf_counter()
        self.stage_ms = {"render": (t1 - t0) * 1e3, "convert": (t2 - t1) * 1e3}
        return frame

    def close(self) -> None:
        pass


class CudaPictures:
    """The CUDA renderer draws and converts on the GPU; one copy brings the planes to the host."""

    def __init__(self, renderer: Any, pix_fmt: str) -> None:
        self.renderer = renderer
        self.pix_fmt = pix_fmt
        self.stage_ms: dict[str, float] = {}

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        frame: av.VideoFrame = self.renderer.render_frame(camera, self.pix_fmt)
        self.stage_ms = dict(self.renderer.last_timings)
        return frame

    def close(self) -> None:
        self.renderer.close()
