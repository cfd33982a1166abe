"""AV1 on the CPU through PyAV's SVT-AV1, set for real time: low-delay prediction (no frame
waits for a later one), constant bit rate, keyframes only when asked. NVENC's AV1 (Ada and
later) is encode/nvenc.py's."""

from __future__ import annotations

import os

from render_server.config import Resolution
from render_server.encode.pyav_encoder import ENDLESS_GOP, PyavVideoEncoder
from render_server.encode.x264 import VBV_FRAMES  # as libx264: a keyframe borrows a few frames

# SVT-AV1 4.1's fastest preset in its real-time mode (rtc=1; 12 and 13 map to 11): ~4.4 ms a
# 720p frame here, ~30 ms a keyframe.
PRESET = 11


def svtav1_options(threads: int | None = None) -> dict[str, str]:
    """AVOptions for libsvtav1. SVT-AV1 refuses variable rate with low-delay prediction, so
    rate control is CBR (rc=2); `keyint=-1` with an endless GOP leaves keyframes to requests
    (every forced keyframe carries the sequence header: measured); `lp` bounds its threads."""
    lp = threads if threads is not None else min(os.cpu_count() or 1, 8)
    params = ["rtc=1", "pred-struct=1", "rc=2", "lookahead=0", "keyint=-1", "scd=0", f"lp={lp}"]
    return {"preset": str(PRESET), "svtav1-params": ":".join(params)}


def create_svtav1_encoder(resolution: Resolution, fps: float, bitrate: int) -> PyavVideoEncoder:
    # SVT-AV1 writes a dozen info and warning lines to stderr per encoder it opens (one per
    # session and per bit rate change): errors only, unless the operator asked otherwise
    os.environ.setdefault("SVT_LOG", "1")
    return PyavVideoEncoder(
        "libsvtav1",
        "AV1",
        resolution.width,
        resolution.height,
        fps,
        bitrate,
        svtav1_options(),
        gop_size=ENDLESS_GOP,
        vbv_frames=VBV_FRAMES,
        retarget_by_reopening=True,
    )
