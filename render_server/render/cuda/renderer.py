"""The CUDA renderer: the CPU rasterizer's rules as CUDA kernels (`shaders/*.cu`), run by pycuda.

A frame is one launch sequence on one stream:

    upload     the frame constants (view-projection matrix, view rays: 256 bytes, pinned)
    clear      visibility keys ← 0, job counters ← 0
    setup      one thread per triangle: transform, cull, barycentric and depth planes,
               near/guard-band clipping, raster jobs appended to a small and a large list
    (readback) the two job counts, the one host sync of the frame (a bigger job buffer and a
               second setup when a list overflowed)
    raster     raster_small (a thread per small job), raster_large (a block per band of rows)
    shade      one thread per pixel → RGB8 in device memory
    convert    RGB → NV12 or yuv420p on the GPU (`render_frame`, `render_device_frame`)
    copy       one device → pinned host copy: the RGB frame (`render`) or the 4:2:0 planes
               (`render_frame`); none for `render_device_frame`, whose NV12 planes stay in
               device memory for NVENC to read in place (a CUDA `av.VideoFrame` over DLPack)

`LaunchSequence` holds that sequence and its buffers over a small `Backend` interface:
`CudaRenderer` runs it on the GPU through pycuda; `cuda_emulation.EmulatedCudaRenderer` runs
the same sequence, same buffers and same kernel sources compiled as C++ on the host, which is
how CI checks the kernels without a GPU. pycuda is imported only when a `CudaRenderer` is made.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

import av
import numpy as np

from render_server.render import cpu
from render_server.render.camera import OrbitCamera
from render_server.render.cuda import dlpack
from render_server.render.scene import Scene

log = logging.getLogger(__name__)

SHADERS_DIR = Path(__file__).resolve().parents[2] / "shaders"  # render_server/shaders
SHADER_FILES = ("raster.cu", "shade.cu", "convert.cu")
COMMON_HEADER = "common.cuh"
# No fused multiply-adds but the kernels' explicit ones: the CPU renderer's visibility pass
# does not fuse (numba without fastmath), and without contraction the GPU computes exactly
# what the host emulation computes. Costs the shading a few percent of its arithmetic.
NVCC_OPTIONS = ("--fmad=false",)
PIX_FMTS = ("nv12", "yuv420p")

FRAME_DOUBLES = 32  # frame constants: vp (16, row-major), then cpu._view (14), padding
JOB_BYTES = 32  # 8 int32: triangle, three fixed-point corners, rows (raster.cu JOB_INTS)
PLANE_WIDTH = 10  # raster.cu PLANE_WIDTH, cpu.py's planes[t, 0:10]
DEPTH_WIDTH = 3
MAX_JOBS = 1 << 27  # 4 GiB of jobs: a scene past this is refused rather than allocated
# NV12 frames left in device memory, used in turn: the encoder may still hold the frame before
# last (a still camera re-encodes the last picture) while the next one is drawn
DEVICE_FRAMES = 3
# their row pitch: FFmpeg's own CUDA frames, which NVENC is written against, align rows to 256 B
DEVICE_PITCH_ALIGN = 256


class CudaUnavailable(RuntimeError):
    """No CUDA renderer here; the message says why (pycuda, driver, device or nvcc)."""


@dataclass(frozen=True)
class KernelSpec:
    """An entry point of `shaders/*.cu`: `name(int count, ...)`.

    `args` lists the parameters after the count, pycuda's prepared-call codes: P a pointer,
    i an int32. `per_block`: one block of `block` threads per item (the lanes), else one
    thread per item.
    """

    name: str
    source: str
    args: str
    block: int
    per_block: bool = False


KERNELS = {
    spec.name: spec
    for spec in (
        KernelSpec("clear", "raster.cu", "PP", 256),
        KernelSpec("setup", "raster.cu", "PPPiiPPPiPiP", 128),
        KernelSpec("raster_small", "raster.cu", "PPiP", 128),
        KernelSpec("raster_large", "raster.cu", "PPiP", 256, per_block=True),
        KernelSpec("shade", "shade.cu", "PPPPPiPPPPiPiPiP", 256),
        KernelSpec("rgb_to_nv12", "convert.cu", "PiiiP", 256),
        KernelSpec("rgb_to_yuv420p", "convert.cu", "PiiP", 256),
    )
}


def shader_defines() -> dict[str, str]:
    """The constants the kernels share with cpu.py, passed as -D so cpu.py stays their source."""
    return {
        "SUBPIXEL": str(cpu.SUBPIXEL),
        "GUARD_BAND": repr(float(cpu.GUARD_BAND)),
        "SPAN_MIN_WIDTH": str(cpu.SPAN_MIN_WIDTH),
        "EMPTY_DEPTH": f"({float(cpu.EMPTY_DEPTH)!r}f)",
        "SHADOW_SIZE": str(cpu.SHADOW_SIZE),
        "TILE": str(cpu.TILE),
        "TILE_STEP": str(cpu.TILE_STEP),
        "COARSE": str(cpu.COARSE),
        "LUT_SIZE": str(cpu.LUT_SIZE),
        "LUT_MAX": repr(float(cpu.LUT_MAX)),
    }


def shader_source(name: str) -> str:
    """The text of `shaders/name`; it includes common.cuh from SHADERS_DIR.

    (pycuda keys its compiler cache on the preprocessed text of sources that include files, so
    a change to the header recompiles.)
    """
    return (SHADERS_DIR / name).read_text()


def check_size(width: int, height: int) -> None:
    """The frame sizes every renderer accepts (as `CpuRenderer`)."""
    if not (1 <= width <= 8192 and 1 <= height <= 8192):
        raise ValueError(f"frame size {width}x{height} is outside 1..8192")


class Backend(Protocol):
    """Device memory, transfers and launches on one stream; addresses are plain ints."""

    # where `alloc`'s memory lives, as DLPack names it: (dlpack.KDL_CUDA, ordinal) on a GPU
    dlpack_device: tuple[int, int]

    def alloc(self, nbytes: int) -> int: ...

    def free(self, address: int) -> None: ...

    def owner(self, address: int) -> object:
        """The object that holds the allocation at `address` (kept alive by exports)."""
        ...

    def pinned(self, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray: ...

    def upload(self, address: int, source: np.ndarray) -> None: ...

    def download(self, target: np.ndarray, address: int) -> None: ...

    def launch(self, kernel: KernelSpec, count: int, args: Sequence[int]) -> None: ...

    def record(self) -> Any: ...

    def synchronize(self) -> None: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...

    def active(self) -> contextlib.AbstractContextManager[None]: ...

    def close(self) -> None: ...


class LaunchSequence:
    """The scene's tables in device memory, the frame's buffers, and the launch sequence."""

    def __init__(self, backend: Backend, scene: Scene, width: int, height: int) -> None:
        check_size(width, height)
        self.backend = backend
        self.width = width
        self.height = height
        self.prepared = p = cpu._prepare(scene)
        self.triangle_count = scene.triangle_count
        self.timings: dict[str, float] = {}
        t, pixels = self.triangle_count, width * height
        self._positions = self._table(p.positions.reshape(t, 9), np.float32)
        self._cull_back = self._table(p.cull_back, np.uint8)
        self._material_ids = self._table(p.material_ids, np.int32)
        self._triangles = self._table(p.triangles, np.float32)
        self._materials = self._table(p.materials, np.float32)
        self._light = self._table(p.light, np.float32)
        self._shadow_matrix = self._table(p.shadow_matrix, np.float64)
        self._shadow_tiles = self._table(p.shadow_tiles, np.float32)
        self._shadow_coarse = self._table(p.shadow_coarse, np.float32)
        self._lut = self._table(p.lut, np.uint8)
        self._last_tap = int(p.shadow_tiles.shape[0] - cpu.TILE - 2)
        self._last_block = int(p.shadow_coarse.shape[0] - 1)
        self._floor_material = int(p.materials.shape[0] - 1)

        self._frame_host = backend.pinned((FRAME_DOUBLES,), np.float64)
        self._frame_host[:] = 0.0
        self._frame = backend.alloc(FRAME_DOUBLES * 8)
        self._keys = backend.alloc(pixels * 8)
        self._planes = backend.alloc(t * PLANE_WIDTH * 8)
        self._depth_planes = backend.alloc(t * DEPTH_WIDTH * 8)
        self._counters = backend.alloc(2 * 8)
        self._counters_host = backend.pinned((2,), np.uint64)
        self._small_capacity = max(4096, 2 * t)
        self._small_jobs = backend.alloc(self._small_capacity * JOB_BYTES)
        self._large_capacity = max(4096, t // 8)
        self._large_jobs = backend.alloc(self._large_capacity * JOB_BYTES)
        self._rgb = backend.alloc(pixels * 3)
        self._rgb_host = backend.pinned((height, width, 3), np.uint8)
        self._yuv = 0
        if width % 2 == 0 and height % 2 == 0:
            self._yuv = backend.alloc(pixels * 3 // 2)
            self._yuv_host = backend.pinned((height * 3 // 2, width), np.uint8)
        self._device_frames: list[int] = []  # allocated at the first device frame
        self.device_pitch = -(-width // DEVICE_PITCH_ALIGN) * DEVICE_PITCH_ALIGN
        self._next_device_frame = 0
        backend.synchronize()

    def _table(self, array: np.ndarray, dtype: type[np.generic]) -> int:
        data = np.ascontiguousarray(array, dtype=dtype)
        address = self.backend.alloc(data.nbytes)
        self.backend.upload(address, data)
        self.backend.synchronize()  # the source may be pageable and temporary
        return address

    def constants(self, camera: OrbitCamera) -> tuple[np.ndarray, np.ndarray]:
        """The view-projection matrix and cpu._view constants the CPU renderer uses."""
        vp = camera.view_projection(self.width / self.height)
        return vp, cpu._view(camera, self.width, self.height, self.prepared.floor)

    # -- the launch sequence ------------------------------------------------------------------

    def draw(self, vp: np.ndarray, view: np.ndarray, output: str = "rgb") -> np.ndarray:
        """One frame; returns the pinned host buffer it was copied into (reused next call).

        `output` "rgb": (height, width, 3) uint8. "nv12" or "yuv420p": the 4:2:0 planes as a
        (height·3/2, width) uint8 array (see shaders/convert.cu for the layout).
        """
        if output not in ("rgb", *PIX_FMTS):
            raise ValueError(f"unknown output {output!r}")
        if output != "rgb" and not self._yuv:
            raise ValueError(f"4:2:0 needs even sides, got {self.width}x{self.height}")
        return self._draw(vp, view, output, None)

    def draw_on_device(self, vp: np.ndarray, view: np.ndarray) -> int:
        """One frame as NV12 left in device memory: the address of its Y plane, which the
        UV plane follows (rows `device_pitch` bytes apart in both). The buffer is one of
        `DEVICE_FRAMES` used in turn; the stream is synchronized, so the planes are complete on
        return."""
        if not self._yuv:
            raise ValueError(f"4:2:0 needs even sides, got {self.width}x{self.height}")
        address = self.device_frame()
        self._draw(vp, view, "nv12", address)
        self._next_device_frame = (self._next_device_frame + 1) % DEVICE_FRAMES
        return address

    def device_frame(self) -> int:
        """The device NV12 buffer the next `draw_on_device` writes (zeros before its first
        use: a valid picture to open an encoder with)."""
        if not self._device_frames:
            nbytes = self.device_pitch * self.height * 3 // 2
            zeros = np.zeros(nbytes, np.uint8)  # device memory starts undefined
            for _ in range(DEVICE_FRAMES):
                address = self.backend.alloc(nbytes)
                self.backend.upload(address, zeros)
                self._device_frames.append(address)
            self.backend.synchronize()  # `zeros` is pageable and temporary
        return self._device_frames[self._next_device_frame]

    def _draw(
        self, vp: np.ndarray, view: np.ndarray, output: str, device_target: int | None
    ) -> np.ndarray:
        b = self.backend
        marks = {"start": b.record()}
        self._visible(vp, view, marks)
        b.launch(
            KERNELS["shade"], self.width * self.height,
            [self._keys, self._planes, self._triangles, self._material_ids, self._materials,
             self._floor_material, self._frame, self._light, self._shadow_matrix,
             self._shadow_tiles, self._last_tap, self._shadow_coarse, self._last_block,
             self._lut, self.width, self._rgb],
        )  # fmt: skip
        marks["shade"] = b.record()
        if output == "rgb":
            marks["convert"] = marks["shade"]
            target = self._rgb_host
            b.download(target, self._rgb)
        else:
            blocks = (self.width // 2) * (self.height // 2)
            kernel = KERNELS["rgb_to_nv12" if output == "nv12" else "rgb_to_yuv420p"]
            out = self._yuv if device_target is None else device_target
            # NV12 rows: compact for the host copy, `device_pitch` apart for NVENC
            pitch = [self.width if device_target is None else self.device_pitch]
            if output != "nv12":
                pitch = []
            b.launch(kernel, blocks, [self._rgb, self.width, self.height, *pitch, out])
            marks["convert"] = b.record()
            target = self._yuv_host
            if device_target is None:
                b.download(target, self._yuv)
        marks["copy"] = b.record()  # no copy for a device frame: a zero-length stage
        b.synchronize()
        self.timings = self._stages(marks)
        return target

    def keys(self, vp: np.ndarray, first: int = 0, count: int | None = None) -> np.ndarray:
        """The visibility keys (height, width) uint64 of triangles [first, first + count).

        Triangle ids in the keys count from `first`. For tests and tools.
        """
        marks = {"start": self.backend.record()}
        self._visible(vp, np.zeros(14), marks, first, count)
        keys = np.empty((self.height, self.width), np.uint64)
        self.backend.download(keys, self._keys)
        self.backend.synchronize()
        return keys

    def _visible(
        self,
        vp: np.ndarray,
        view: np.ndarray,
        marks: dict[str, Any],
        first: int = 0,
        count: int | None = None,
    ) -> None:
        """Upload, clear, setup, read the job counts back, rasterize."""
        b = self.backend
        count = self.triangle_count - first if count is None else count
        if not (0 <= first and 0 <= count and first + count <= self.triangle_count):
            raise ValueError(f"triangles [{first}, {first + count}) of {self.triangle_count}")
        self._frame_host[:16] = np.asarray(vp, dtype=np.float64).reshape(16)
        self._frame_host[16:30] = view
        b.upload(self._frame, self._frame_host)
        marks["upload"] = b.record()
        while True:
            b.launch(KERNELS["clear"], self.width * self.height, [self._keys, self._counters])
            if count:
                b.launch(
                    KERNELS["setup"], count,
                    [self._positions + 36 * first, self._cull_back + first, self._frame,
                     self.width, self.height, self._planes, self._depth_planes,
                     self._small_jobs, self._small_capacity, self._large_jobs,
                     self._large_capacity, self._counters],
                )  # fmt: skip
            marks["setup"] = b.record()
            b.download(self._counters_host, self._counters)
            b.synchronize()
            small, large = int(self._counters_host[0]), int(self._counters_host[1])
            if small <= self._small_capacity and large <= self._large_capacity:
                break
            self._grow(small, large)
        marks["readback"] = b.record()
        args = [self._small_jobs, self._depth_planes, self.width, self._keys]
        if small:
            b.launch(KERNELS["raster_small"], small, args)
        if large:
            b.launch(KERNELS["raster_large"], large, [self._large_jobs, *args[1:]])
        marks["raster"] = b.record()

    def _grow(self, small: int, large: int) -> None:
        """Make room for the job counts a setup reported (with a margin for the next frames)."""
        b = self.backend
        if max(small, large) > MAX_JOBS:
            raise RuntimeError(
                f"the frame needs {max(small, large)} raster jobs, over the limit of {MAX_JOBS}"
            )
        if small > self._small_capacity:
            b.free(self._small_jobs)
            self._small_capacity = min(MAX_JOBS, small + small // 4)
            self._small_jobs = b.alloc(self._small_capacity * JOB_BYTES)
        if large > self._large_capacity:
            b.free(self._large_jobs)
            self._large_capacity = min(MAX_JOBS, large + large // 4)
            self._large_jobs = b.alloc(self._large_capacity * JOB_BYTES)

    def _stages(self, marks: dict[str, Any]) -> dict[str, float]:
        """Milliseconds per stage between consecutive marks, and the total."""
        names = ["start", "upload", "setup", "readback", "raster", "shade", "convert", "copy"]
        b = self.backend
        timings = {
            name: b.elapsed_ms(marks[before], marks[name])
            for before, name in zip(names, names[1:], strict=False)
        }
        timings["total"] = b.elapsed_ms(marks["start"], marks["copy"])
        return timings


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
    events (see the module docstring for the stages).
    """

    def __init__(self, scene: Scene, width: int, height: int, device: int = 0) -> None:
        check_size(width, height)
        backend = PyCudaBackend(device)
        try:
            super().__init__(backend, scene, width, height)
        except BaseException:
            backend.close()
            raise


# FFmpeg's CUDA device shares a GPU's primary context only when the context has exactly these
# flags (hwcontext_cuda.c: "Primary context already active with incompatible flags")
CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def share_primary_context(ordinal: int) -> str | None:
    """Give GPU `ordinal`'s primary context the flags FFmpeg's CUDA device (and so NVENC on our
    frames) needs, before it is first made active; None when it has them, else why not.

    The context's flags can change only while nobody holds it active: the first renderer of a
    worker sets them. Blocking sync also makes a waiting thread sleep instead of spin, which
    is what a worker of many sessions wants.
    """
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"libcuda cannot be loaded: {exc}"
    device, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    if libcuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return f"no CUDA device {ordinal}"
    if libcuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(active)):
        return "cuDevicePrimaryCtxGetState failed"
    if flags.value == CU_CTX_SCHED_BLOCKING_SYNC:
        return None
    if active.value:
        return (
            f"GPU {ordinal}'s primary context is already active with flags {flags.value:#x} "
            f"(FFmpeg needs {CU_CTX_SCHED_BLOCKING_SYNC:#x}): another library started it first"
        )
    set_flags = getattr(libcuda, "cuDevicePrimaryCtxSetFlags_v2", None)
    if set_flags is None:
        set_flags = libcuda.cuDevicePrimaryCtxSetFlags
    if set_flags(device, CU_CTX_SCHED_BLOCKING_SYNC) != 0:
        return "cuDevicePrimaryCtxSetFlags failed"
    return None


class PyCudaBackend:
    """`Backend` on a CUDA device: its primary context, one stream, kernels from SourceModule.

    The primary context is the one every library in the process shares by default (FFmpeg's
    CUDA device with `primary_ctx`, CuPy, PyTorch): all renderers of a worker live in one
    context per GPU instead of one each, and NVENC can read their buffers in place.
    """

    def __init__(self, device: int = 0) -> None:
        if importlib.util.find_spec("pycuda") is None:
            raise CudaUnavailable("pycuda is not installed: pip install '.[gpu]'")
        try:
            import pycuda.driver as cuda
        except ImportError as exc:  # pycuda links libcuda: no driver, no import
            raise CudaUnavailable(f"pycuda cannot load the CUDA driver (libcuda): {exc}") from exc
        try:
            cuda.init()
            count = cuda.Device.count()
        except cuda.Error as exc:
            raise CudaUnavailable(
                f"the CUDA driver did not start ({exc}): no GPU, or a driver too old for "
                "this pycuda"
            ) from exc
        if count == 0:
            raise CudaUnavailable("no CUDA device: the driver sees no GPU")
        if not 0 <= device < count:
            raise CudaUnavailable(f"no CUDA device {device}: the driver sees {count}")
        self._cuda = cuda
        self._device = cuda.Device(device)
        self.dlpack_device = (dlpack.KDL_CUDA, device)
        unshared = share_primary_context(device)
        if unshared is not None:  # rendering works; frames for NVENC then go through the host
            log.warning("cuda.primary_context", extra={"reason": unshared})
        self._context = self._device.retain_primary_context()
        self._context.push()  # pop it before returning
        self._allocations: dict[int, Any] = {}
        self._host: list[Any] = []
        try:
            self._stream = cuda.Stream()
            self._functions = self._compile()
        except BaseException:
            self._context.pop()
            self._context.detach()
            raise
        self._context.pop()

    def _compile(self) -> dict[str, Any]:
        from pycuda.compiler import SourceModule

        defines = [f"-D{name}={value}" for name, value in shader_defines().items()]
        functions: dict[str, Any] = {}
        for name in SHADER_FILES:
            try:
                module = SourceModule(
                    shader_source(name),
                    options=[*NVCC_OPTIONS, *defines],
                    no_extern_c=True,
                    include_dirs=[str(SHADERS_DIR)],
                )
            except OSError as exc:  # pycuda: "nvcc was not found (is it on the PATH?)"
                raise CudaUnavailable(
                    f"cannot compile shaders/{name}: nvcc (the CUDA toolkit) is needed at "
                    f"start ({exc})"
                ) from exc
            for spec in KERNELS.values():
                if spec.source == name:
                    function = module.get_function(spec.name)
                    function.prepare("i" + spec.args)
                    functions[spec.name] = function
        return functions

    @property
    def device_name(self) -> str:
        return str(self._device.name())

    def alloc(self, nbytes: int) -> int:
        allocation = self._cuda.mem_alloc(max(nbytes, 1))
        address = int(allocation)
        self._allocations[address] = allocation
        return address

    def free(self, address: int) -> None:
        self._allocations.pop(address).free()

    def owner(self, address: int) -> object:
        return self._allocations[address]

    def pinned(self, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
        array = self._cuda.pagelocked_empty(shape, dtype)
        self._host.append(array.base)
        return array

    def upload(self, address: int, source: np.ndarray) -> None:
        self._cuda.memcpy_htod_async(address, source, self._stream)

    def download(self, target: np.ndarray, address: int) -> None:
        self._cuda.memcpy_dtoh_async(target, address, self._stream)

    def launch(self, kernel: KernelSpec, count: int, args: Sequence[int]) -> None:
        if count <= 0:
            return
        if kernel.per_block:
            grid = (count, 1)
        else:
            grid = (math.ceil(count / kernel.block), 1)
        self._functions[kernel.name].prepared_async_call(
            grid, (kernel.block, 1, 1), self._stream, count, *args
        )

    def record(self) -> Any:
        event = self._cuda.Event()
        event.record(self._stream)
        return event

    def synchronize(self) -> None:
        self._stream.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(end.time_since(start))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self._context.push()
        try:
            yield
        finally:
            self._cuda.Context.pop()

    def close(self) -> None:
        self._context.push()
        try:
            self._stream.synchronize()
            for allocation in self._allocations.values():
                allocation.free()
            for host in self._host:
                host.free()
            self._allocations.clear()
            self._host.clear()
            self._functions = {}
        finally:
            self._cuda.Context.pop()
            self._context.detach()
