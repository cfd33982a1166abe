"""A video encoder on top of PyAV's codec contexts (libx264 here; NVENC in the GPU path)."""

from __future__ import annotations

import fractions

import av
from av.video.frame import PictureType

VIDEO_TIME_BASE = fractions.Fraction(1, 90000)  # the RTP clock of every video codec


class PyavVideoEncoder:
    """Encodes yuv420p frames with one PyAV codec; one access unit out per frame in."""

    def __init__(
        self,
        codec_name: str,
        rtp_codec: str,
        width: int,
        height: int,
        fps: float,
        bitrate: int,
        options: dict[str, str],
        pix_fmt: str = "yuv420p",
    ) -> None:
        self.codec = rtp_codec
        self.width = width
        self.height = height
        self.bitrate = bitrate
        ctx = av.CodecContext.create(codec_name, "w")
        assert isinstance(ctx, av.VideoCodecContext)
        ctx.width = width
        ctx.height = height
        ctx.pix_fmt = pix_fmt
        ctx.time_base = VIDEO_TIME_BASE
        ctx.framerate = fractions.Fraction(fps).limit_denominator(1001)
        ctx.bit_rate = bitrate
        ctx.max_b_frames = 0
        ctx.options = dict(options)
        ctx.open()
        self._ctx: av.VideoCodecContext | None = ctx

    def encode(self, frame: av.VideoFrame, pts: int, keyframe: bool = False) -> av.Packet | None:
        if (frame.width, frame.height) != (self.width, self.height):
            raise ValueError(
                f"frame is {frame.width}x{frame.height}, encoder is {self.width}x{self.height}"
            )
        frame.pts = pts
        frame.time_base = VIDEO_TIME_BASE
        # with forced-idr, an I picture type makes the encoder emit an IDR with SPS/PPS
        frame.pict_type = PictureType.I if keyframe else PictureType.NONE
        if self._ctx is None:
            raise RuntimeError("the encoder is closed")
        packets = self._ctx.encode(frame)
        if not packets:
            return None
        if len(packets) == 1:
            packet = packets[0]
        else:  # Annex B access units concatenate into one valid access unit
            packet = av.Packet(b"".join(bytes(p) for p in packets))
            packet.pts = packets[0].pts
            packet.is_keyframe = any(p.is_keyframe for p in packets)
        packet.time_base = VIDEO_TIME_BASE
        if packet.pts is None:
            packet.pts = pts
        return packet

    def close(self) -> None:
        """Release the codec; PyAV frees it once the context is unreferenced."""
        self._ctx = None
