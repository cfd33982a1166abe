"""A video encoder on top of PyAV's codec contexts (libx264 on the CPU; NVENC on the GPU)."""

from __future__ import annotations

import contextlib
import fractions
import functools
import logging
import time

import av
from av.video.frame import PictureType

from render_server.encode.protocol import EncodedPacket
from render_server.thread_policy import demote_realtime_threads

log = logging.getLogger(__name__)

VIDEO_TIME_BASE = fractions.Fraction(1, 90000)  # the RTP clock of every video codec
# libavcodec's gop_size has no "infinite" for NVENC, libvpx or SVT-AV1: a GOP this long never
# ends in practice (over a year at 60 fps); keyframes come from requests (forced IDR) only.
ENDLESS_GOP = 2**31 - 1
# encoders that take a new bit rate only by reopening: a change this big (relative) or more ...
RETARGET_STEP = 0.25
# ... and at most once per this many seconds (each reopen costs a keyframe)
RETARGET_INTERVAL_S = 2.0


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
    constant_rate: bool = False,
    threads: int | None = None,
) -> av.VideoCodecContext:
    """A PyAV video encoder context of one size, open: the RTP clock as its time base, no
    B-frames, `bitrate` as its bit rate and its rate buffer's maximum.

    The rate buffer (VBV) is given in frames and set through the generic `maxrate`/`bufsize`
    options: libx264 re-reads them from the codec context on every frame, so VBV settings in
    `x264-params` would be silently reset to none.

    `pix_fmt="cuda"` (NVENC only) opens by encoding `prime`, a device frame of the right size
    whose packet is dropped: see `PyavVideoEncoder`.

    `constant_rate` also sets the minimum rate to the bit rate: libvpx's rate control is CBR
    only when minimum, maximum and target agree.
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
    if threads is not None:
        ctx.thread_count = threads
    bufsize = max(1000, int(bitrate * vbv_frames / fps))
    rates = {"maxrate": str(bitrate), "bufsize": str(bufsize)}
    if constant_rate:
        rates["minrate"] = str(bitrate)
    ctx.options = {**options, **rates}
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
    demote_realtime_threads()  # SVT-AV1 run by root makes its threads and ours real-time
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
        constant_rate: bool = False,
        retarget_by_reopening: bool = False,
        threads: int | None = None,
    ) -> None:
        self.codec = rtp_codec
        self.codec_name = codec_name
        self.width = width
        self.height = height
        self.pix_fmt = pix_fmt
        self.max_bitrate = bitrate
        # the same context at another bit rate: what a reopen (`retarget_by_reopening`) opens
        self._open_at = functools.partial(
            open_codec_context, codec_name, width, height, fps, options=options,
            pix_fmt=pix_fmt, gop_size=gop_size, vbv_frames=vbv_frames,
            constant_rate=constant_rate, threads=threads,
        )  # fmt: skip
        self._retarget_by_reopening = retarget_by_reopening
        self._reopen_at: int | None = None  # a bit rate to reopen at before the next frame
        self._opened_at = time.monotonic()
        self.reopens = 0
        ctx = self._open_at(bitrate=bitrate, prime=prime)
        self._idr_next = pix_fmt == "cuda"  # the decoder never sees the primed picture
        self._ctx: av.VideoCodecContext | None = ctx

    @property
    def bitrate(self) -> int:
        if self._reopen_at is not None:
            return self._reopen_at
        return int(self._ctx.bit_rate or 0) if self._ctx is not None else 0

    def set_bitrate(self, bitrate: int) -> int:
        """Aim at `bitrate` from the next frame on, never above the configured maximum.

        Both libx264 and NVENC reconfigure their rate control when the context's bit rate
        changes between frames; the rate buffer keeps its configured size. libvpx and SVT-AV1
        through FFmpeg 8 ignore that change (measured: a 6 → 1 Mbit/s step left either at its
        old rate), so those encoders (`retarget_by_reopening`) are opened afresh at the new
        rate, which costs a keyframe: only for a change of RETARGET_STEP or more, and at most
        once per RETARGET_INTERVAL_S.
        """
        target = max(100_000, min(int(bitrate), self.max_bitrate))
        if self._ctx is None:
            return target
        if not self._retarget_by_reopening:
            if target != self._ctx.bit_rate:
                self._ctx.bit_rate = target
            return target
        current = int(self._ctx.bit_rate or 0)
        if abs(target - current) < RETARGET_STEP * current:
            self._reopen_at = None  # back near the rate it runs at: nothing to do
            return current
        self._reopen_at = target
        return target

    def _reopen_if_due(self) -> bool:
        """Open the codec afresh at the bit rate asked for, once the interval allows; True
        when it did (the next frame must then be a keyframe)."""
        if self._reopen_at is None or self._ctx is None or self.pix_fmt == "cuda":
            return False
        if time.monotonic() - self._opened_at < RETARGET_INTERVAL_S:
            return False
        target, self._reopen_at = self._reopen_at, None
        self._end(self._ctx)
        self._ctx = self._open_at(bitrate=target)
        self._opened_at = time.monotonic()
        self.reopens += 1
        log.info("encoder.reopened", extra={"encoder": self.codec_name, "bitrate": target})
        return True

    def encode(
        self, frame: av.VideoFrame, pts: int, keyframe: bool = False
    ) -> EncodedPacket | None:
        if (frame.width, frame.height) != (self.width, self.height):
            raise ValueError(
                f"frame is {frame.width}x{frame.height}, encoder is {self.width}x{self.height}"
            )
        if self._ctx is None:
            raise RuntimeError("the encoder is closed")
        if self._reopen_if_due():
            keyframe = True  # a fresh encoder has no reference for the decoder's pictures
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
        """Release the codec; PyAV frees it once the context is unreferenced. SVT-AV1 is told
        the stream ended first (an end-of-stream flush; a real-time encoder holds no frame),
        or it logs an error as it is freed."""
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            self._end(ctx)

    def _end(self, ctx: av.VideoCodecContext) -> None:
        if self.codec_name == "libsvtav1":
            with contextlib.suppress(av.error.FFmpegError):
                ctx.encode(None)
