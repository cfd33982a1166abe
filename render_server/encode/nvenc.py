"""NVENC through PyAV: H.264, HEVC and AV1 with the low-latency settings proven by Sunshine."""

from __future__ import annotations

from typing import Final, Literal

import av

from render_server.config import Resolution
from render_server.encode.pyav_encoder import ENDLESS_GOP, PyavVideoEncoder

NvencCodec = Literal["h264", "hevc", "av1"]
NVENC_CODECS: Final[dict[NvencCodec, tuple[str, str]]] = {
    # codec → (PyAV encoder, RTP codec name)
    "h264": ("h264_nvenc", "H264"),
    "hevc": ("hevc_nvenc", "H265"),
    "av1": ("av1_nvenc", "AV1"),
}
# RTP codec → NVENC codec, for the codecs a worker's sessions may be sent in
NVENC_NAMES: Final[dict[str, NvencCodec]] = {"H264": "h264", "AV1": "av1"}


def nvenc_options(
    codec: NvencCodec, preset: str = "p1", intra_refresh: bool = False
) -> dict[str, str]:
    """AVOptions: ultra-low-latency tuning, CBR, no lookahead or reordering, IDR on request."""
    options = {
        "preset": preset,  # p1 fastest .. p4 balanced; all are real-time at 4K on NVENC
        "tune": "ull",
        "rc": "cbr",
        "zerolatency": "1",
        "delay": "0",  # the default buffers frames inside the encoder
        "forced-idr": "1",  # an I picture type becomes an IDR (with SPS/PPS: no global header)
        "rc-lookahead": "0",
        "no-scenecut": "1",
        "intra-refresh": "1" if intra_refresh else "0",
    }
    if codec == "h264":
        options["profile"] = "baseline"  # what aiortc's SDP says (42e01f): no CABAC, no B
    return options


def create_nvenc_encoder(
    codec: NvencCodec,
    resolution: Resolution,
    fps: float,
    bitrate: int,
    pix_fmt: str = "nv12",
    preset: str = "p1",
    intra_refresh: bool = False,
    prime: av.VideoFrame | None = None,
) -> PyavVideoEncoder:
    """An NVENC encoder; raises av.error.FFmpegError (or OSError) where NVENC cannot open.

    `pix_fmt` "nv12" or "yuv420p" takes host frames (FFmpeg uploads them to the GPU);
    "cuda" takes frames in GPU memory, read in place, and opens on `prime`, one such frame
    (see `PyavVideoEncoder`).
    """
    codec_name, rtp_codec = NVENC_CODECS[codec]
    return PyavVideoEncoder(
        codec_name,
        rtp_codec,
        resolution.width,
        resolution.height,
        fps,
        bitrate,
        nvenc_options(codec, preset, intra_refresh),
        pix_fmt=pix_fmt,
        gop_size=ENDLESS_GOP,
        vbv_frames=1.0,  # one frame of rate buffer: each frame fits in one frame interval
        prime=prime,
    )
