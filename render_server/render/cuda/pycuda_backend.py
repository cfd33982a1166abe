"""The CUDA renderer's `Backend` on a GPU, through pycuda: the device's primary context, one
stream, the kernels compiled by nvcc at start (pycuda's `SourceModule`), or loaded as PTX that
an image compiled when it was built (`precompiled`).

pycuda is imported when a `PyCudaBackend` is made, not with this module: it is an optional
extra (`pip install '.[gpu]'`), and importing it needs the CUDA driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np

from render_server.render.cuda import dlpack
from render_server.render.cuda.kernels import (
    KERNELS,
    NVCC_OPTIONS,
    SHADER_FILES,
    SHADERS_DIR,
    KernelSpec,
    shader_defines,
    shader_source,
)
from render_server.render.cuda.precompiled import precompiled_ptx

log = logging.getLogger(__name__)


class CudaUnavailable(RuntimeError):
    """No CUDA renderer here; the message says why (pycuda, driver, device or nvcc)."""


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
            ptx = precompiled_ptx(name)
            if ptx is not None:  # compiled when the image was built: no nvcc needed here
                module = self._cuda.module_from_buffer(ptx)
                log.debug("cuda.kernels_precompiled", extra={"source": name})
                self._prepare(module, name, functions)
                continue
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
            self._prepare(module, name, functions)
        return functions

    @staticmethod
    def _prepare(module: Any, source: str, functions: dict[str, Any]) -> None:
        for spec in KERNELS.values():
            if spec.source == source:
                function = module.get_function(spec.name)
                function.prepare("i" + spec.args)
                functions[spec.name] = function

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
        self._host.append(array.base)  # the page-locked allocation, freed by `close`
        return cast(np.ndarray, array)  # pycuda has no annotations; this is an ndarray

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
