"""libx264 through PyAV with the low-latency settings of the CPU path."""

from __future__ import annotations

from render_server.config import Resolution
from render_server.encode.pyav_encoder import PyavVideoEncoder

# Constrained Baseline is what aiortc's SDP offers (profile-level-id 42e01f): no B-frames, no CABAC.
X264_PROFILE = "baseline"
# The rate buffer, in frames. One frame (NVENC's setting) starves x264's IDRs of quality at
# these bitrates; a few frames let a keyframe borrow from its neighbours.
VBV_FRAMES = 3.0


def x264_options(threads: int = 0) -> dict[str, str]:
    """AVOptions for libx264: zero latency, keyframes only on request, SPS/PPS on every IDR."""
    params = [
        "keyint=infinite",  # keyframes only when asked (start, PLI/FIR)
        "scenecut=0",
        "bframes=0",
        "repeat-headers=1",  # SPS/PPS in front of every IDR: late joiners and fresh decoders start
        "annexb=1",  # start codes, which aiortc's H.264 packetizer splits on
        "forced-idr=1",  # a forced I picture is an IDR, not a recovery point
        "nal-hrd=none",
        "colorprim=bt709",
        "transfer=bt709",
        "colormatrix=bt709",
        "fullrange=off",
        f"threads={threads}",  # 0: x264 decides (sliced threads under zerolatency)
    ]
    return {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "profile": X264_PROFILE,
        "x264-params": ":".join(params),
    }


def create_x264_encoder(
    resolution: Resolution, fps: float, bitrate: int, threads: int = 0
) -> PyavVideoEncoder:
    return PyavVideoEncoder(
        "libx264",
        "H264",
        resolution.width,
        resolution.height,
        fps,
        bitrate,
        x264_options(threads),
        vbv_frames=VBV_FRAMES,
    )
