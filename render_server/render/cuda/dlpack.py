"""DLPack export of memory the project owns, so PyAV can wrap it in a frame without a copy.

pycuda's device allocations speak no DLPack, and PyAV's `VideoFrame.from_dlpack` (PyAV ≥ 18)
is how a CUDA buffer becomes an `AV_PIX_FMT_CUDA` frame that NVENC reads in place. This
module builds the legacy (unversioned) `dltensor` capsule around a raw address with ctypes:
the one format every consumer reads (PyAV, numpy, CuPy, PyTorch).

The exported memory stays the exporter's: the consumer's deleter only releases the small
DLPack structs and the reference to `owner` (which keeps host memory alive; device memory
freed explicitly by its renderer is invalid from then on, whatever frames still point at it).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Final

KDL_CPU: Final = 1
KDL_CUDA: Final = 2
_KDL_UINT: Final = 1
_NAME: Final = b"dltensor"  # lives as long as the module: capsules keep a pointer to it


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _ManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _Tensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _Deleter),
    ]


# Private prototypes: setting argtypes on ctypes.pythonapi's shared attributes would change
# them for every other user in the process. The capsule arrives as a bare pointer in the
# destructor (its reference count is already zero: no Python object may be made of it).
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", ctypes.pythonapi))
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# address of a live _ManagedTensor → (the struct, its shape array, the owner it keeps alive)
_live: dict[int, tuple[_ManagedTensor, Any, object]] = {}
_live_lock = threading.Lock()


def _release(address: int | None) -> None:
    if address:
        with _live_lock:
            _live.pop(address, None)


def _deleter_callback(address: int | None) -> None:
    # called by the consumer, from any thread (ctypes takes the GIL for it)
    _release(address)


def _capsule_destructor_callback(capsule: int | None) -> None:
    # a capsule nobody consumed still owns its tensor; a consumed one was renamed
    # "used_dltensor" and its consumer calls the deleter instead
    if capsule and _capsule_is_valid(capsule, _NAME):
        _release(_capsule_get_pointer(capsule, _NAME))


# C function pointers to the callbacks; module globals, so they live as long as any capsule
_deleter = _Deleter(_deleter_callback)
_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor_callback)


def live_exports() -> int:
    """Tensors exported and not yet released by their consumers (for leak tests)."""
    with _live_lock:
        return len(_live)


@dataclass(frozen=True)
class BufferView:
    """A uint8 array of `shape` at `address` on DLPack device `device`.

    `device` is (device type, ordinal): (KDL_CUDA, n) for GPU n's memory, (KDL_CPU, 0) for
    host memory. `owner` is kept alive until every consumer of an export has let go.
    `strides` (in elements, as DLPack counts them) for rows wider than the array, e.g. a
    plane of `pitch`-byte rows: (pitch, 1); None for a compact row-major array.
    """

    address: int
    shape: tuple[int, ...]
    device: tuple[int, int]
    owner: object = None
    strides: tuple[int, ...] | None = None

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """A fresh `dltensor` capsule. The memory is ready when this is called (the producer
        synchronized its stream), so `stream` needs no event; `copy=True` is refused."""
        if copy:
            raise BufferError("BufferView exports its memory in place; it cannot copy")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"the buffer is on device {self.device}, not {dl_device}")
        if not self.address:
            raise BufferError("cannot export a null address")
        if self.strides is not None and len(self.strides) != len(self.shape):
            raise BufferError(f"strides {self.strides} do not fit shape {self.shape}")
        shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        strides = None
        if self.strides is not None:
            strides = (ctypes.c_int64 * len(self.strides))(*self.strides)
        managed = _ManagedTensor()
        tensor = managed.dl_tensor
        tensor.data = self.address
        tensor.device = _Device(*self.device)
        tensor.ndim = len(self.shape)
        tensor.dtype = _DataType(_KDL_UINT, 8, 1)
        tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = (
            None if strides is None else ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        )  # None: compact, row-major
        tensor.byte_offset = 0
        managed.deleter = _deleter
        address = ctypes.addressof(managed)
        with _live_lock:
            _live[address] = (managed, (shape, strides), self.owner)
        return _capsule_new(address, _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p))
