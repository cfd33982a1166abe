"""The CUDA renderer's kernels run on the host: a test instrument for machines without a GPU.

`shaders/*.cu` are written to compile both with nvcc and, as plain C++, with g++ (see
shaders/common.cuh): each kernel's entry point loops over its items on the host. This module
compiles them into a shared library (cached by a hash of the sources and flags) and drives it
through ctypes with `launch.LaunchSequence`, the same launch sequence and buffers `CudaRenderer`
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

from render_server.render.cuda import dlpack
from render_server.render.cuda.kernels import (
    COMMON_HEADER,
    KERNELS,
    SHADER_FILES,
    SHADERS_DIR,
    KernelSpec,
    shader_defines,
)
from render_server.render.cuda.launch import LaunchSequence
from render_server.render.cuda.renderer import KernelRenderer
from render_server.render.scene import Scene

# No contraction (see kernels.NVCC_OPTIONS) and no fast-math: IEEE arithmetic as on the GPU.
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
    """`launch.Backend` in host memory: numpy arrays for device buffers, ctypes for launches.

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
