"""The CUDA renderer's frame: one launch sequence on one stream, over a small `Backend`.

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

`LaunchSequence` holds that sequence, the scene's tables (`cpu.prepare.prepare_scene`, the
CPU renderer's) and the frame's buffers. The `Backend` is `pycuda_backend.PyCudaBackend` on a
GPU, or `emulation.HostBackend`, which runs the same kernel sources compiled as C++ on the host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from render_server.render.camera import OrbitCamera
from render_server.render.cpu.prepare import VIEW_WIDTH, prepare_scene, view_constants
from render_server.render.cpu.raster import PLANE_WIDTH
from render_server.render.cpu.shading import TILE
from render_server.render.cuda.kernels import DEPTH_WIDTH, KERNELS, KernelSpec
from render_server.render.protocol import check_frame_size
from render_server.render.scene import Scene

PIX_FMTS = ("nv12", "yuv420p")
FRAME_DOUBLES = 32  # frame constants: vp (16, row-major), then view_constants (14), padding
JOB_BYTES = 32  # 8 int32: triangle, three fixed-point corners, rows (raster.cu JOB_INTS)
MAX_JOBS = 1 << 27  # 4 GiB of jobs: a scene past this is refused rather than allocated
# NV12 frames left in device memory, used in turn: the encoder may still hold the frame before
# last (a still camera re-encodes the last picture) while the next one is drawn
DEVICE_FRAMES = 3
# their row pitch: FFmpeg's own CUDA frames, which NVENC is written against, align rows to 256 B
DEVICE_PITCH_ALIGN = 256


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
        check_frame_size(width, height)
        self.backend = backend
        self.width = width
        self.height = height
        self.prepared = p = prepare_scene(scene)
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
        self._last_tap = int(p.shadow_tiles.shape[0] - TILE - 2)
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
        """The view-projection matrix and view constants, as the CPU renderer computes them."""
        vp = camera.view_projection(self.width / self.height)
        return vp, view_constants(camera, self.width, self.height, self.prepared.floor)

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
        self._visible(vp, np.zeros(VIEW_WIDTH), marks, first, count)
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
        self._frame_host[16 : 16 + VIEW_WIDTH] = view
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
