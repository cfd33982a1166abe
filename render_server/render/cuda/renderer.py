"""The CUDA renderer: the CPU renderer's picture drawn by CUDA kernels (`shaders/*.cu`).

`KernelRenderer` is the `Renderer` over a `launch.LaunchSequence` (see there for the stages
of a frame) and the frames it hands out: RGB, 4:2:0 planes in pinned host memory, or NV12
left in device memory for NVENC. `CudaRenderer` runs it on a GPU through pycuda
(`pycuda_backend`); `emulation.EmulatedCudaRenderer` runs the same kernel sources and launch
sequence on the host, which is how CI checks the kernels without a GPU. pycuda is imported
only when a `CudaRenderer` is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Self

import av
import numpy as np

from render_server.render.camera import OrbitCamera
from render_server.render.cuda import dlpack
from render_server.render.cuda.launch import PIX_FMTS, Backend, LaunchSequence
from render_server.render.cuda.pycuda_backend import CudaUnavailable, PyCudaBackend
from render_server.render.protocol import check_frame_size
from render_server.render.scene import Scene

__all__ = ["CudaRenderer", "CudaUnavailable", "KernelRenderer"]


class KernelRenderer:
    """A `Renderer` over a `LaunchSequence`; see `CudaRenderer` and `EmulatedCudaRenderer`."""

    def __init__(self, backend: Backend, scene: Scene, width: int, height: int) -> None:
        self.scene = scene
        self.width = width
        self.height = height
        self.last_timings: dict[str, float] = {}
        self._backend = backend
        self._closed = False
        self._cuda_context: Any = None  # PyAV's CudaContext, made at the first device frame
        with backend.active():
            self._pipeline = LaunchSequence(backend, scene, width, height)

    def render(self, camera: OrbitCamera) -> np.ndarray:
        """The frame for `camera`: (height, width, 3) uint8 sRGB in pinned host memory.

        The array is the renderer's and is overwritten by the next `render` call.
        """
        with self._active():
            vp, view = self._pipeline.constants(camera)
            frame = self._pipeline.draw(vp, view, "rgb")
            self.last_timings = self._pipeline.timings
        return frame

    def render_frame(self, camera: OrbitCamera, pix_fmt: str = "nv12") -> av.VideoFrame:
        """The frame for `camera` as an `av.VideoFrame` in `pix_fmt` ("nv12" or "yuv420p").

        Rendered and converted on the device, then copied once into pinned host memory that
        the frame's planes point at (no RGB readback). That memory is the renderer's: the next
        `render_frame` call overwrites it, and `close` frees it. A caller that keeps a frame
        longer copies it (the encoders copy their input while encoding).
        """
        if pix_fmt not in PIX_FMTS:
            raise ValueError(f"pix_fmt must be one of {PIX_FMTS}, got {pix_fmt!r}")
        with self._active():
            vp, view = self._pipeline.constants(camera)
            planes = self._pipeline.draw(vp, view, pix_fmt)
            self.last_timings = self._pipeline.timings
        return av.VideoFrame.from_numpy_buffer(planes, format=pix_fmt)

    def render_device_frame(self, camera: OrbitCamera) -> av.VideoFrame:
        """The frame for `camera` as NV12 that stays where it was drawn: on a GPU, a CUDA
        `av.VideoFrame` (format "cuda", sw_format nv12) over the renderer's device memory,
        which NVENC reads in place; no copy to the host at all.

        The frame's memory is one of `DEVICE_FRAMES` buffers used in turn: valid until that
        many more device frames are drawn, and not after `close`.
        """
        with self._active():
            vp, view = self._pipeline.constants(camera)
            address = self._pipeline.draw_on_device(vp, view)
            self.last_timings = self._pipeline.timings
            return self._wrap_device_frame(address)

    def blank_device_frame(self) -> av.VideoFrame:
        """A device frame of this size without drawing (what the next `render_device_frame`
        will overwrite): an encoder that takes device frames opens on it."""
        with self._active():
            return self._wrap_device_frame(self._pipeline.device_frame())

    def _wrap_device_frame(self, address: int) -> av.VideoFrame:
        if not hasattr(av.VideoFrame, "from_dlpack"):
            raise RuntimeError(f"PyAV {av.__version__} cannot wrap device memory: PyAV ≥ 18")
        w, h, pitch = self.width, self.height, self._pipeline.device_pitch
        device = self._backend.dlpack_device
        owner = self._backend.owner(address)
        y = dlpack.BufferView(address, (h, w), device, owner, (pitch, 1))
        uv = dlpack.BufferView(address + pitch * h, (h // 2, w), device, owner, (pitch, 1))
        if device[0] != dlpack.KDL_CUDA:  # the host emulation: an nv12 frame over host memory
            return av.VideoFrame.from_dlpack((y, uv), format="nv12", width=w, height=h)
        if self._cuda_context is None:
            from av.video.frame import CudaContext

            # the device's primary context, which PyCudaBackend also runs in: NVENC registers
            # our buffers in the context that allocated them
            self._cuda_context = CudaContext(device_id=device[1], primary_ctx=True)
        return av.VideoFrame.from_dlpack(
            (y, uv), format="nv12", width=w, height=h, cuda_context=self._cuda_context
        )

    def close(self) -> None:
        """Free the device and pinned memory; frames returned earlier become invalid."""
        if not self._closed:
            self._closed = True
            self._backend.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _active(self) -> Iterator[None]:
        if self._closed:
            raise RuntimeError("the renderer is closed")
        with self._backend.active():
            yield


class CudaRenderer(KernelRenderer):
    """Draws `scene` at `width` × `height` on CUDA device `device`, as the CPU renderer does.

    Raises `CudaUnavailable` when pycuda, the driver, the device or nvcc is missing. Runs in the
    device's primary CUDA context (shared with the worker's other renderers and with FFmpeg),
    made current around each call, so any one thread at a time may use the renderer.
    `last_timings` holds the milliseconds per stage of the last frame, measured with CUDA
    events (the stages are listed in `launch`).
    """

    def __init__(self, scene: Scene, width: int, height: int, device: int = 0) -> None:
        check_frame_size(width, height)
        backend = PyCudaBackend(device)
        try:
            self.device_name = backend.device_name  # the GPU's name, as the driver gives it
            super().__init__(backend, scene, width, height)
        except BaseException:
            backend.close()
            raise
