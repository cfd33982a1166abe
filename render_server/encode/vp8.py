"""VP8 through PyAV's libvpx, with the real-time settings of libwebrtc's VP8 encoder: the codec
every WebRTC browser decodes (Firefox as Debian ships it offers no H.264)."""

from __future__ import annotations

from render_server.config import Resolution
from render_server.encode.pyav_encoder import ENDLESS_GOP, PyavVideoEncoder
from render_server.encode.x264 import VBV_FRAMES  # as libx264: a keyframe borrows a few frames

# Real-time speed: 12 of libvpx's -16..16 (16 fastest). 720p frames of the CPU renderer took
# 3 ms at 16, 5.5 ms at 8 here; libwebrtc uses -6..-12 on desktop CPUs.
CPU_USED = 12
# One thread: VP8 splits a frame across threads only by token partitions, and with the
# renderer's threads and the browser on the same cores its threads waited on each other
# (encode p95 168 ms at 720p with two threads, 13 ms with one, beside Chromium on two cores).
THREADS = 1
# A keyframe of at most this many frames' worth of bits (percent of a frame's budget): without
# it libvpx made 17-frame keyframes at 4 Mbit/s, a burst that stalls a narrow link.
MAX_INTRA_RATE_PCT = 300


def vp8_options() -> dict[str, str]:
    """AVOptions for libvpx's VP8 encoder: no lookahead or alternate reference frames (no
    delay), constant bit rate, keyframes only when asked (the GOP is endless)."""
    return {
        "deadline": "realtime",
        "cpu-used": str(CPU_USED),
        "lag-in-frames": "0",
        "auto-alt-ref": "0",
        "max-intra-rate": str(MAX_INTRA_RATE_PCT),
        "undershoot-pct": "100",  # libwebrtc's: drop below the target rather than overshoot
        "overshoot-pct": "15",
        "noise-sensitivity": "0",
        "static-thresh": "0",
    }


def create_vp8_encoder(resolution: Resolution, fps: float, bitrate: int) -> PyavVideoEncoder:
    return PyavVideoEncoder(
        "libvpx",
        "VP8",
        resolution.width,
        resolution.height,
        fps,
        bitrate,
        vp8_options(),
        gop_size=ENDLESS_GOP,
        vbv_frames=VBV_FRAMES,
        constant_rate=True,
        retarget_by_reopening=True,
        threads=THREADS,
    )
