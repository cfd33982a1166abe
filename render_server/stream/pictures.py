"""Where a session's pictures come from: a renderer plus whatever makes its output encodable."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import av
import numpy as np

from render_server.config import Resolution
from render_server.encode.convert import YuvConverter
from render_server.encode.nvenc import NvencCodec, create_nvenc_encoder
from render_server.encode.protocol import Encoder
from render_server.render.camera import OrbitCamera
from render_server.render.cpu import CpuRenderer
from render_server.render.scene import Scene


class PictureSource(Protocol):
    """Encoder-ready pictures for a camera; `stage_ms` holds the last picture's stage times."""

    pix_fmt: str
    stage_ms: dict[str, float]

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        """The picture for `camera`; the frame object may be reused by the next call."""
        ...

    def set_scene(self, scene: Scene) -> None:
        """Draw `scene` from the next picture on."""
        ...

    def close(self) -> None: ...


class CpuPictures:
    """CPU renderer → RGB → BT.709 4:2:0 in one reused frame (libx264 and NVENC both read it).

    Each band of rows is converted by the thread that drew it, as soon as it is drawn (while in
    that core's cache, and with no second wait for every thread): `stage_ms` has one stage,
    "render", the whole picture.
    """

    pix_fmt = "yuv420p"

    def __init__(self, renderer: CpuRenderer) -> None:
        self.renderer = renderer
        self.converter = YuvConverter(renderer.width, renderer.height)
        self.stage_ms: dict[str, float] = {}

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        t0 = time.perf_counter()
        self.renderer.render(camera, self.converter.rows(self.renderer.frame))
        t1 = time.perf_counter()
        self.stage_ms = {"render": (t1 - t0) * 1e3}
        return self.converter.frame

    def set_scene(self, scene: Scene) -> None:
        self.renderer.set_scene(scene)

    def close(self) -> None:
        pass


class CudaPictures:
    """The CUDA renderer draws and converts on the GPU; one copy brings the planes to the host,
    or with `pix_fmt` "cuda" none: the pictures are CUDA frames over the renderer's device
    memory, which NVENC reads in place.

    Its scene lives in device memory: another scene takes a new renderer, which `make_renderer`
    (given a scene) builds; the old one is closed once the new one stands.
    """

    def __init__(
        self, renderer: Any, pix_fmt: str, make_renderer: Callable[[Scene], Any] | None = None
    ) -> None:
        self.renderer = renderer
        self.pix_fmt = pix_fmt
        self.stage_ms: dict[str, float] = {}
        self._make_renderer = make_renderer

    def picture(self, camera: OrbitCamera) -> av.VideoFrame:
        frame: av.VideoFrame
        if self.pix_fmt == "cuda":
            frame = self.renderer.render_device_frame(camera)
        else:
            frame = self.renderer.render_frame(camera, self.pix_fmt)
        self.stage_ms = dict(self.renderer.last_timings)
        return frame

    def blank(self) -> av.VideoFrame:
        """A picture of the right size and kind without drawing (to open an encoder on)."""
        if self.pix_fmt == "cuda":
            frame: av.VideoFrame = self.renderer.blank_device_frame()
            return frame
        return av.VideoFrame(self.renderer.width, self.renderer.height, self.pix_fmt)

    def set_scene(self, scene: Scene) -> None:
        if self._make_renderer is None:
            raise RuntimeError("these pictures cannot change their scene")
        renderer = self._make_renderer(device_scene(scene))
        self.renderer.close()
        self.renderer = renderer

    def close(self) -> None:
        self.renderer.close()


def nvenc_on_device(
    pictures: CudaPictures,
    fps: float,
    bitrate: int,
    preset: str = "p1",
    intra_refresh: bool = False,
    codec: NvencCodec = "h264",
) -> Encoder:
    """An NVENC encoder (H.264 unless `codec` says otherwise) that reads `pictures` (pix_fmt
    "cuda") where they were drawn, opened on one of them.

    Raises whatever FFmpeg or NVENC raise where that does not work, having closed `pictures`.
    """
    try:
        resolution = Resolution(pictures.renderer.width, pictures.renderer.height)
        return create_nvenc_encoder(
            codec, resolution, fps, bitrate, pix_fmt="cuda", preset=preset,
            intra_refresh=intra_refresh, prime=pictures.blank(),
        )  # fmt: skip
    except BaseException:
        pictures.close()
        raise


def device_scene(scene: Scene) -> Scene:
    """`scene`, or for a scene without triangles (every object hidden) the same scene with one
    triangle of no area at its lowest corner: it covers no pixel and casts no shadow, and the
    device tables (which cannot be empty allocations) keep a row."""
    if scene.triangle_count:
        return scene
    corner = np.repeat(scene.bounds_min[None, None, :], 3, axis=1)
    return Scene(
        positions=corner,
        normals=np.tile(np.array([0.0, 1.0, 0.0], np.float32), (1, 3, 1)),
        material_ids=np.zeros(1, np.int32),
        materials=scene.materials,
        light_direction=scene.light_direction,
        light_color=scene.light_color,
        objects=scene.objects,
        object_ids=np.zeros(1, np.int32),
        bounds=(scene.bounds_min, scene.bounds_max),
    )
