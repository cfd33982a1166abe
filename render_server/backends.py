"""Which renderer and encoder a worker uses: `auto` takes the GPU path where it works.

An explicit `cuda` or `nvenc` that cannot work is an error at start; `auto` falls back to the
CPU with one log line that says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from .config import ConfigError
from .gpu import CudaStatus, GpuDevice, NvencStatus, probe_cuda, probe_nvenc

log = logging.getLogger(__name__)

RendererRequest = Literal["auto", "cuda", "cpu"]
EncoderRequest = Literal["auto", "nvenc", "x264", "replay"]


class BackendUnavailable(ConfigError):
    """An explicitly requested backend cannot run on this machine."""


@dataclass(frozen=True)
class Backends:
    renderer: Literal["cuda", "cpu"]
    encoder: Literal["nvenc", "x264", "replay"]
    renderer_reason: str
    encoder_reason: str
    encoder_requested: EncoderRequest = "auto"
    gpu: GpuDevice | None = None

    @property
    def pix_fmt(self) -> str:
        """The encoder's input format: NVENC reads NV12, libx264 planar 4:2:0."""
        return "nv12" if self.encoder == "nvenc" else "yuv420p"


def choose_backends(
    renderer: RendererRequest,
    encoder: EncoderRequest,
    cuda: CudaStatus | None = None,
    nvenc: NvencStatus | None = None,
) -> Backends:
    """Resolve the requests against what this machine offers (probing what is not given)."""
    if encoder == "replay":
        # load tests: a clip rendered once on the CPU and sent in a loop; no GPU involved
        return Backends(
            "cpu", "replay", "replay renders its clip once, on the CPU",
            "a pre-encoded clip in a loop (--encoder replay, for load tests)", encoder,
        )  # fmt: skip
    if renderer != "cpu" or encoder != "x264":
        cuda = cuda if cuda is not None else probe_cuda()
    gpu = cuda.devices[0] if cuda is not None and cuda.devices else None

    renderer_used: Literal["cuda", "cpu"]
    encoder_used: Literal["nvenc", "x264"]
    if renderer == "cpu":
        renderer_used, renderer_reason = "cpu", "asked for"
    elif cuda is not None and cuda.available:
        renderer_used, renderer_reason = "cuda", f"{gpu.name if gpu else 'GPU'} through pycuda"
    elif renderer == "cuda":
        raise BackendUnavailable(f"--renderer cuda cannot run here: {cuda.reason if cuda else ''}")
    else:
        renderer_used, renderer_reason = "cpu", f"no CUDA renderer: {cuda.reason if cuda else ''}"
        log.warning("backend.fallback", extra={"stage": "renderer", "reason": renderer_reason})

    if encoder == "x264":
        encoder_used, encoder_reason = "x264", "asked for"
    else:
        nvenc = nvenc if nvenc is not None else probe_nvenc("h264", cuda.devices if cuda else ())
        if nvenc.available:
            encoder_used, encoder_reason = "nvenc", "h264_nvenc opened and encoded a test frame"
        elif encoder == "nvenc":
            raise BackendUnavailable(f"--encoder nvenc cannot run here: {nvenc.reason}")
        else:
            encoder_used, encoder_reason = "x264", f"no NVENC: {nvenc.reason}"
            log.warning("backend.fallback", extra={"stage": "encoder", "reason": encoder_reason})
    return Backends(renderer_used, encoder_used, renderer_reason, encoder_reason, encoder, gpu)
