"""The encoder stage: one picture in, one compressed access unit out."""

from __future__ import annotations

from typing import Protocol

import av


class Encoder(Protocol):
    """Encodes pictures of one fixed size; output packets carry pts in 1/90000 s."""

    codec: str  # the RTP codec name, e.g. "H264"
    codec_name: str  # the FFmpeg encoder, e.g. "libx264", "h264_nvenc"
    width: int
    height: int
    pix_fmt: str  # what `encode` expects: "yuv420p", "nv12", or "cuda" (frames in GPU memory)

    @property
    def bitrate(self) -> int:
        """Bits per second aimed at now."""
        ...

    def set_bitrate(self, bitrate: int) -> int:
        """Aim at `bitrate` from the next frame on (capped); returns the bitrate applied."""
        ...

    def encode(self, frame: av.VideoFrame, pts: int, keyframe: bool = False) -> av.Packet | None:
        """One access unit for `frame` (None only while an encoder is still filling a delay)."""
        ...

    def close(self) -> None: ...
