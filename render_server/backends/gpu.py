"""What this machine's GPU can do: CUDA devices through pycuda, NVENC by opening an encoder.

Every probe says *why* when the answer is no, in words an operator can act on; `auto` backend
choices and `render-server doctor` are built on these answers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import av
import av.logging
import numpy as np

from render_server.config import Resolution

if TYPE_CHECKING:
    from render_server.encode.nvenc import NvencCodec

# Datacenter GPUs built for compute have no NVENC engine at all (NVIDIA's support matrix).
GPUS_WITHOUT_NVENC = ("A100", "A800", "A30", "H100", "H800", "H200")
NVENC_MIN_DRIVER = 570  # the NVENC API of the FFmpeg inside PyAV's wheels


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    compute_capability: str
    memory_mib: int

    @property
    def has_nvenc(self) -> bool:
        return not any(model in self.name for model in GPUS_WITHOUT_NVENC)


@dataclass(frozen=True)
class CudaStatus:
    available: bool
    reason: str
    cuda_driver_api: str | None = None
    nvidia_driver: str | None = None
    devices: tuple[GpuDevice, ...] = ()


@dataclass(frozen=True)
class NvencStatus:
    codec: str
    available: bool
    reason: str
    log: list[str] = field(default_factory=list)


def nvidia_driver_version() -> str | None:
    """The NVIDIA kernel driver version from nvidia-smi, or None where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def probe_cuda() -> CudaStatus:
    """CUDA through pycuda: its import, the driver and the devices."""
    try:
        import pycuda.driver as cuda
    except ImportError:
        return CudaStatus(False, "pycuda is not installed (pip install '.[gpu]')")
    except Exception as exc:  # pycuda built against a CUDA the machine lacks, and such
        return CudaStatus(False, f"pycuda does not load: {exc}")
    try:
        cuda.init()
    except Exception as exc:
        return CudaStatus(False, f"no CUDA driver: {exc}")
    api = cuda.get_driver_version()
    devices = []
    for index in range(cuda.Device.count()):
        device = cuda.Device(index)
        major, minor = device.compute_capability()
        devices.append(
            GpuDevice(index, device.name(), f"{major}.{minor}", device.total_memory() >> 20)
        )
    driver_api = f"{api // 1000}.{api % 1000 // 10}"
    if not devices:
        return CudaStatus(False, "the CUDA driver sees no GPU", driver_api, nvidia_driver_version())
    return CudaStatus(True, "ok", driver_api, nvidia_driver_version(), tuple(devices))


@contextlib.contextmanager
def _ffmpeg_log() -> Iterator[list[tuple[int, str, str]]]:
    """FFmpeg's own log lines while the block runs (PyAV keeps them off by default)."""
    previous = av.logging.get_level()
    av.logging.set_level(av.logging.VERBOSE)
    try:
        with av.logging.Capture(local=False) as captured:
            yield captured
    finally:
        av.logging.set_level(previous)


def _missing_video_capability(environ: Mapping[str, str]) -> str:
    """Why a container may lack the NVENC library: the NVIDIA Container Toolkit mounts it only
    for the `video` driver capability ("" where that is not the cause we can see)."""
    capabilities = environ.get("NVIDIA_DRIVER_CAPABILITIES")
    if capabilities is None:
        return ""
    granted = {c.strip() for c in capabilities.split(",")}
    if granted & {"video", "all"}:
        return ""
    return (
        f": in a container, NVIDIA_DRIVER_CAPABILITIES must include video (it is "
        f"{capabilities!r}), or the NVIDIA Container Toolkit does not mount it"
    )


def explain_nvenc_failure(
    log_lines: list[str],
    devices: tuple[GpuDevice, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> str:
    """A plain reason from FFmpeg's NVENC messages (and what we know about the GPU and the
    container)."""
    text = " ".join(log_lines)
    no_nvenc = [d.name for d in devices if not d.has_nvenc]
    if no_nvenc:
        return (
            f"{no_nvenc[0]} has no NVENC engine (A100, H100 and H200 have none): "
            "encoding falls back to libx264 on the CPU"
        )
    if "libcuda" in text or "dynamic load CUDA" in text:
        return "no CUDA driver (libcuda.so.1 cannot be loaded)"
    if "libnvidia-encode" in text:
        why = _missing_video_capability(os.environ if environ is None else environ)
        return f"the NVIDIA driver has no NVENC library (libnvidia-encode.so.1){why}"
    if "required nvenc API version" in text or "Driver does not support" in text:
        return f"the NVIDIA driver is too old for NVENC here (need {NVENC_MIN_DRIVER} or newer)"
    if "out of memory" in text or "incompatible client key" in text or "OpenEncodeSession" in text:
        return "NVENC session limit reached (consumer GPUs allow a few concurrent encoders)"
    if "No capable devices" in text or "No NVENC capable devices" in text:
        return "no NVENC-capable GPU found"
    return f"NVENC did not open: {text.strip() or 'no reason given by FFmpeg'}"


def probe_nvenc(codec: NvencCodec = "h264", devices: tuple[GpuDevice, ...] = ()) -> NvencStatus:
    """Open an NVENC encoder of `codec` and encode one frame: the only test that counts."""
    from render_server.encode.nvenc import create_nvenc_encoder  # an encode import here stays lazy

    with _ffmpeg_log() as captured:
        try:
            encoder = create_nvenc_encoder(codec, Resolution(256, 256), 30.0, 1_000_000)
            frame = av.VideoFrame.from_ndarray(np.zeros((256, 256, 3), np.uint8), format="rgb24")
            packet = encoder.encode(frame.reformat(format="nv12"), pts=0, keyframe=True)
            encoder.close()
        except Exception as exc:
            lines = [line for _, _, line in captured] + [str(exc)]
            return NvencStatus(codec, False, explain_nvenc_failure(lines, devices), lines)
    if packet is None:
        return NvencStatus(codec, False, "NVENC opened but produced no packet for a frame")
    return NvencStatus(codec, True, "ok")


def describe(status: Any) -> dict[str, Any]:
    """A JSON-ready view of a probe result."""
    from dataclasses import asdict

    doc = asdict(status)
    if isinstance(status, CudaStatus):
        for device, original in zip(doc["devices"], status.devices, strict=True):
            device["has_nvenc"] = original.has_nvenc
    return doc
