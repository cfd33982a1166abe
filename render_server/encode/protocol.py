"""The encoder stage: one picture in, one compressed access unit out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

import av

if TYPE_CHECKING:
    from av.stream import Stream

# One access unit. PyAV's stubs make `av.Packet` generic in the container stream it belongs to;
# an encoder's packets come from a bare codec context and belong to none, which is the bound.
EncodedPacket: TypeAlias = "av.Packet[Stream]"


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

    def encode(
        self, frame: av.VideoFrame, pts: int, keyframe: bool = False
    ) -> EncodedPacket | None:
        """One access unit for `frame` (None only while an encoder is still filling a delay)."""
        ...

    def close(self) -> None: ...
