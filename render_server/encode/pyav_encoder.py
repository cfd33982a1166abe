"""A video encoder on top of PyAV's codec contexts (libx264 on the CPU; NVENC on the GPU)."""

from __future__ import annotations

import fractions

import av
from av.video.frame import PictureType

from render_server.encode.protocol import EncodedPacket

VIDEO_TIME_BASE = fractions.Fraction(1, 90000)  # the RTP clock of every video codec


def open_codec_context(
    codec_name: str,
    width: int,
    height: int,
    fps: float,
    bitrate: int,
    options: dict[str, str],
    pix_fmt: str = "yuv420p",
    gop_size: int | None = None,
    vbv_frames: float = 3.0,
    prime: av.VideoFrame | None = None,
) -> av.VideoCodecContext:
    """A PyAV video encoder context of one size, open: the RTP clock as its time base, no
    B-frames, `bitrate` as its bit rate and its rate buffer's maximum.

    The rate buffer (VBV) is given in frames and set through the generic `maxrate`/`bufsize`
    options: libx264 re-reads them from the codec context on every frame, so VBV settings in
    `x264-params` would be silently reset to none.

    `pix_fmt="cuda"` (NVENC only) opens by encoding `prime`, a device frame of the right size
    whose packet is dropped: see `PyavVideoEncoder`.
    """
    ctx = av.CodecContext.create(codec_name, "w")
    assert isinstance(ctx, av.VideoCodecContext)
    ctx.width = width
    ctx.height = height
    ctx.pix_fmt = pix_fmt
    ctx.time_base = VIDEO_TIME_BASE
    ctx.framerate = fractions.Fraction(fps).limit_denominator(1001)
    ctx.bit_rate = bitrate
    ctx.max_b_frames = 0
    if gop_size is not None:
        ctx.gop_size = gop_size
    bufsize = max(1000, int(bitrate * vbv_frames / fps))
    ctx.options = {**options, "maxrate": str(bitrate), "bufsize": str(bufsize)}
    if pix_fmt == "cuda":
        if prime is None or prime.format.name != "cuda":
            raise ValueError("an encoder of CUDA frames opens on a CUDA frame (prime)")
        if (prime.width, prime.height) != (width, height):
            raise ValueError(f"prime is {prime.width}x{prime.height}, not {width}x{height}")
        prime.pts = 0
        prime.time_base = VIDEO_TIME_BASE
        ctx.encode(prime)  # adopts the frame's hw_frames_ctx, then opens
    else:
        ctx.open()
    return ctx


class PyavVideoEncoder:
    """Encodes frames of one size with one PyAV codec; one access unit out per frame in.

    The codec context is `open_codec_context`'s (its rate buffer given in frames).

    `pix_fmt="cuda"` takes frames in GPU memory (NVENC only). Such an encoder needs the frames
    context a CUDA frame carries before it can open, and PyAV adopts it from the first frame
    it encodes: the encoder opens by encoding `prime` (a device frame of the right size, whose
    packet is dropped) and makes its next frame an IDR, so that opening still fails here, at
    construction, where the caller can fall back.
    """

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
        gop_size: int | None = None,
        vbv_frames: float = 3.0,
        prime: av.VideoFrame | None = None,
    ) -> None:
        self.codec = rtp_codec
        self.codec_name = codec_name
        self.width = width
        self.height = height
        self.pix_fmt = pix_fmt
        self.max_bitrate = bitrate
        ctx = open_codec_context(
            codec_name, width, height, fps, bitrate, options, pix_fmt, gop_size, vbv_frames, prime
        )
        self._idr_next = pix_fmt == "cuda"  # the decoder never sees the primed picture
        self._ctx: av.VideoCodecContext | None = ctx

    @property
    def bitrate(self) -> int:
        return int(self._ctx.bit_rate or 0) if self._ctx is not None else 0

    def set_bitrate(self, bitrate: int) -> int:
        """Aim at `bitrate` from the next frame on, never above the configured maximum.

        Both libx264 and NVENC reconfigure their rate control when the context's bit rate
        changes between frames; the rate buffer keeps its configured size.
        """
        target = max(100_000, min(int(bitrate), self.max_bitrate))
        if self._ctx is not None and target != self._ctx.bit_rate:
            self._ctx.bit_rate = target
        return target

    def encode(
        self, frame: av.VideoFrame, pts: int, keyframe: bool = False
    ) -> EncodedPacket | None:
        if (frame.width, frame.height) != (self.width, self.height):
            raise ValueError(
                f"frame is {frame.width}x{frame.height}, encoder is {self.width}x{self.height}"
            )
        if self._ctx is None:
            raise RuntimeError("the encoder is closed")
        frame.pts = pts
        frame.time_base = VIDEO_TIME_BASE
        keyframe, self._idr_next = keyframe or self._idr_next, False
        # with forced-idr, an I picture type makes the encoder emit an IDR with SPS/PPS
        frame.pict_type = PictureType.I if keyframe else PictureType.NONE
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
