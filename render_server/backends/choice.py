"""Which renderer and encoder a worker uses: `auto` takes the GPU path where it works.

An explicit `cuda` or `nvenc` that cannot work is an error at start; `auto` falls back to the
CPU with one log line that says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import av

from render_server.backends.gpu import CudaStatus, GpuDevice, NvencStatus, probe_cuda, probe_nvenc
from render_server.config import ConfigError, EncoderName, NvencInput, RendererName
from render_server.encode.codecs import CODECS, CPU_ENCODERS, cpu_codecs
from render_server.encode.nvenc import NVENC_CODECS

log = logging.getLogger(__name__)


class BackendUnavailable(ConfigError):
    """An explicitly requested backend cannot run on this machine."""


@dataclass(frozen=True)
class Backends:
    renderer: Literal["cuda", "cpu"]
    encoder: Literal["nvenc", "x264", "replay"]
    renderer_reason: str
    encoder_reason: str
    encoder_requested: EncoderName = "auto"
    gpu: GpuDevice | None = None
    # CUDA renderer + NVENC: whether NVENC reads the frames in GPU memory or a host copy
    nvenc_input: NvencInput = "host"
    # the RTP codecs NVENC encodes here (H264 where it is used; AV1 on Ada and later)
    nvenc_codecs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.encoder == "nvenc" and not self.nvenc_codecs:  # NVENC always has H.264
            object.__setattr__(self, "nvenc_codecs", ("H264",))

    @property
    def codec_encoders(self) -> dict[str, str]:
        """Every codec these backends encode, in CODECS' order, and the FFmpeg encoder that
        makes it: NVENC's where NVENC has the codec, else the CPU's (a replayed clip: H.264)."""
        if self.encoder == "replay":
            return {"H264": "replay"}
        nvenc = {rtp: name for name, rtp in NVENC_CODECS.values() if rtp in self.nvenc_codecs}
        cpu = {codec: CPU_ENCODERS[codec] for codec in cpu_codecs()}
        return {
            codec: nvenc.get(codec) or cpu[codec] for codec in CODECS if codec in {**cpu, **nvenc}
        }

    @property
    def device_frames(self) -> bool:
        """Frames stay in GPU memory from the renderer to NVENC."""
        return self.renderer == "cuda" and self.encoder == "nvenc" and self.nvenc_input == "device"

    @property
    def host_pix_fmt(self) -> str:
        """What the encoder reads from host memory: the CUDA renderer's NV12 where NVENC
        takes it, else the planar 4:2:0 that libx264 reads and the CPU renderer makes (NVENC
        reads it as well: no conversion between picture and encoder)."""
        return "nv12" if self.renderer == "cuda" and self.encoder == "nvenc" else "yuv420p"

    @property
    def pix_fmt(self) -> str:
        """The encoder's input format: CUDA frames, else `host_pix_fmt`."""
        return "cuda" if self.device_frames else self.host_pix_fmt


def device_frames_supported() -> str | None:
    """None where this PyAV can wrap GPU memory in a frame, else why not."""
    if not hasattr(av.VideoFrame, "from_dlpack"):
        return f"PyAV {av.__version__} cannot take frames in GPU memory (PyAV >= 18 can)"
    return None


def choose_backends(
    renderer: RendererName,
    encoder: EncoderName,
    cuda: CudaStatus | None = None,
    nvenc: NvencStatus | None = None,
    nvenc_input: NvencInput = "device",
) -> Backends:
    """Resolve the requests against what this machine offers (probing what is not given).

    `nvenc_input` "device" keeps the CUDA renderer's frames in GPU memory for NVENC where this
    PyAV can (whether NVENC opens on them is known only when the worker warms up, which falls
    back to "host" with a log line where it does not).
    """
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
    nvenc_codecs: tuple[str, ...] = ()
    if encoder_used == "nvenc":
        av1 = probe_nvenc("av1", cuda.devices if cuda else ())
        nvenc_codecs = ("H264", "AV1") if av1.available else ("H264",)
    nvenc_input_used: NvencInput = "host"
    if renderer_used == "cuda" and encoder_used == "nvenc" and nvenc_input == "device":
        unsupported = device_frames_supported()
        if unsupported is None:
            nvenc_input_used = "device"
        else:
            log.warning("backend.fallback", extra={"stage": "nvenc_input", "reason": unsupported})
    return Backends(
        renderer_used, encoder_used, renderer_reason, encoder_reason, encoder, gpu,
        nvenc_input_used, nvenc_codecs,
    )  # fmt: skip
