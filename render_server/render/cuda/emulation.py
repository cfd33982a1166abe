"""The CUDA renderer's kernels run on the host: a test instrument for machines without a GPU.

`shaders/*.cu` are written to compile both with nvcc and, as plain C++, with g++ (see
shaders/common.cuh): each kernel's entry point loops over its items on the host. This module
compiles them into a shared library (cached by a hash of the sources and flags) and drives it
through ctypes with `cuda.LaunchSequence`, the same launch sequence and buffers `CudaRenderer`
uses, so the tests exercise the real kernels and the real orchestration, only sequentially.
It is sequential and unvectorized (a 320×180 frame of the default scene takes a few ms, a
1280×720 one about 50 ms; the first use compiles for about 2 s) and meant for tests and tools,
not for serving.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trimesh

from render_server.render.cuda import dlpack
from render_server.render.cuda.renderer import (
    COMMON_HEADER,
    KERNELS,
    SHADER_FILES,
    SHADERS_DIR,
    KernelRenderer,
    KernelSpec,
    LaunchSequence,
    shader_defines,
)
from render_server.render.scene import Material, Scene

# No contraction (see cuda.NVCC_OPTIONS) and no fast-math: IEEE arithmetic as on the GPU.
CXX_FLAGS = ("-x", "c++", "-std=c++17", "-O2", "-shared", "-fPIC", "-ffp-contract=off")
_ARG_TYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int}

_library_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def compiler() -> str | None:
    """The C++ compiler the emulation uses ($CXX, else g++), or None when there is none."""
    return shutil.which(os.environ.get("CXX", "g++"))


def library_path(cache_dir: Path | None = None) -> Path:
    """Compile the kernels for the host unless already compiled; the shared library's path."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("the CUDA emulation needs a C++ compiler: install g++ or set $CXX")
    defines = [f"-D{name}={value}" for name, value in shader_defines().items()]
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    for part in (version, *CXX_FLAGS, *defines):
        digest.update(part.encode() + b"\0")
    for name in (COMMON_HEADER, *SHADER_FILES):
        digest.update((SHADERS_DIR / name).read_bytes() + b"\0")
    cache = cache_dir or Path(tempfile.gettempdir()) / f"render-server-cuda-emulation-{os.getuid()}"
    path = cache / f"kernels-{digest.hexdigest()[:20]}.so"
    if path.exists():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    sources = [str(SHADERS_DIR / name) for name in SHADER_FILES]
    command = [cxx, *CXX_FLAGS, f"-I{SHADERS_DIR}", *defines, *sources, "-o", str(partial)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"compiling the kernels for the host failed:\n{result.stderr}")
    os.replace(partial, path)  # atomic: a concurrent test run sees all of it or none
    return path


def load_library() -> ctypes.CDLL:
    """The host build of the kernels, loaded once per process, argument types set."""
    global _library
    with _library_lock:
        if _library is None:
            library = ctypes.CDLL(str(library_path()))
            for spec in KERNELS.values():
                function = getattr(library, spec.name)
                function.argtypes = [ctypes.c_int, *(_ARG_TYPES[code] for code in spec.args)]
                function.restype = None
            _library = library
        return _library


class HostBackend:
    """`cuda.Backend` in host memory: numpy arrays for device buffers, ctypes for launches.

    Launches run to completion on the calling thread, so `record` is a clock reading and the
    stage timings are host times.
    """

    dlpack_device = (dlpack.KDL_CPU, 0)

    def __init__(self) -> None:
        self._library = load_library()
        self._arrays: dict[int, np.ndarray] = {}

    def alloc(self, nbytes: int) -> int:
        array = np.zeros(max(1, math.ceil(nbytes / 8)), np.uint64)  # 8-byte aligned
        address = int(array.ctypes.data)
        self._arrays[address] = array
        return address

    def free(self, address: int) -> None:
        del self._arrays[address]

    def owner(self, address: int) -> object:
        return self._arrays[address]  # exported frames keep the array, so its memory, alive

    def pinned(self, shape: tuple[int, ...], dtype: type[np.generic]) -> np.ndarray:
        return np.zeros(shape, dtype)

    def upload(self, address: int, source: np.ndarray) -> None:
        data = np.ascontiguousarray(source)
        ctypes.memmove(address, data.ctypes.data, data.nbytes)

    def download(self, target: np.ndarray, address: int) -> None:
        if not target.flags.c_contiguous:
            raise ValueError("download target must be C-contiguous")
        ctypes.memmove(target.ctypes.data, address, target.nbytes)

    def launch(self, kernel: KernelSpec, count: int, args: Sequence[int]) -> None:
        if count > 0:
            getattr(self._library, kernel.name)(count, *args)

    def record(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (float(end) - float(start)) * 1e3

    def active(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        self._arrays.clear()


class EmulatedCudaRenderer(KernelRenderer):
    """`CudaRenderer`'s kernels and launch sequence, run on the host (see the module doc)."""

    def __init__(self, scene: Scene, width: int, height: int) -> None:
        super().__init__(HostBackend(), scene, width, height)

    @property
    def pipeline(self) -> LaunchSequence:
        return self._pipeline

    def triangle_ids(self, vp: np.ndarray) -> np.ndarray:
        """The visibility pass alone: the nearest triangle per pixel (−1: none), (H, W) int32.

        The same as `CpuRenderer`'s `_ids` after a render with view-projection `vp`.
        """
        return ids_of(self._pipeline.keys(vp))


def ids_of(keys: np.ndarray) -> np.ndarray:
    """Triangle ids (−1: none) from visibility keys."""
    low = (keys & np.uint64(0xFFFFFFFF)).astype(np.int64)
    ids = np.where(keys == 0, -1, 0xFFFFFFFF - low)
    return ids.astype(np.int32)


def coverage(triangles_ndc: np.ndarray, width: int, height: int) -> np.ndarray:
    """`cpu.coverage` through the kernels: how many of the 2D triangles cover each pixel."""
    tris = np.asarray(triangles_ndc, dtype=np.float32).reshape(-1, 3, 2)
    positions = np.zeros((len(tris), 3, 3), np.float32)
    positions[:, :, :2] = tris
    normals = np.zeros_like(positions)
    normals[:, :, 2] = 1.0
    both_sides = Material("coverage", (1.0, 1.0, 1.0), 1.0, 0.0, True)  # cull nothing
    scene = Scene(positions, normals, np.zeros(len(tris), np.int32), [both_sides])
    vp = np.eye(4)
    vp[2, 2] = 0.0  # z = 0: every corner sits mid-depth, none is clipped
    counts = np.zeros((height, width), np.int32)
    with EmulatedCudaRenderer(scene, width, height) as renderer:
        for k in range(len(tris)):
            counts += renderer.pipeline.keys(vp, first=k, count=1) != 0
    return counts


def sphere_field(spheres_per_side: int = 7, subdivisions: int = 5) -> Scene:
    """A dense scene for load tests: a grid of smooth icospheres over a ground plate.

    7 × 7 spheres of subdivision 5 make 1,003,522 triangles (20,480 a sphere, 2 the plate).
    """
    ball = trimesh.creation.icosphere(subdivisions=subdivisions)
    unit = np.asarray(ball.vertices, dtype=np.float64)[np.asarray(ball.faces)]  # (F, 3, 3)
    palette = [
        Material("clay", (0.7, 0.3, 0.2), 0.7, 0.0, False),
        Material("steel", (0.8, 0.8, 0.85), 0.25, 1.0, False),
        Material("jade", (0.2, 0.6, 0.4), 0.4, 0.0, False),
        Material("ground", (0.45, 0.43, 0.4), 0.85, 0.0, False),
    ]
    positions, normals, ids = [], [], []
    for k in range(spheres_per_side**2):
        row, col = divmod(k, spheres_per_side)
        centre = np.array([col * 2.5, 1.0, row * 2.5])
        positions.append(unit + centre)
        normals.append(unit / np.linalg.norm(unit, axis=2, keepdims=True))
        ids.append(np.full(len(unit), k % 3, np.int32))
    extent = (spheres_per_side - 1) * 2.5
    lo, hi = -2.0, extent + 2.0
    plate = np.array(
        [[[lo, 0, lo], [lo, 0, hi], [hi, 0, hi]], [[lo, 0, lo], [hi, 0, hi], [hi, 0, lo]]]
    )
    positions.append(plate)
    normals.append(np.tile([0.0, 1.0, 0.0], (2, 3, 1)))
    ids.append(np.full(2, 3, np.int32))
    return Scene(np.concatenate(positions), np.concatenate(normals), np.concatenate(ids), palette)
