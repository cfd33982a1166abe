"""What a load-test stream decodes, with which decoder, and how long each frame took.

`--decode`:

- `keyframes` (the default): a keyframe at most once every 30 frames, each alone in a fresh
  decoder: proof that the stream is valid video of the asked size, at almost no cost.
- `every N`: the same with N frames between samples. Not every Nth frame: an H.264, VP8 or
  AV1 P-frame refers back through every frame to the last keyframe, and the worker sends
  keyframes only on request, so decoding one frame in N exactly means decoding them all (and a
  frame decoded without its references is no check: libavcodec conceals what is missing).
- `all`: every frame from the first keyframe on, in order, in one decoder, as a browser would;
  the receiver keeps every frame's payloads for it (marker-bit reassembly, depayloaded).
- `none`: count only.

`--decoder`: `cpu` (libavcodec's h264, vp8, libdav1d), `nvdec` (FFmpeg's `*_cuvid` decoders in
PyAV, on an NVIDIA GPU), `auto` (nvdec where PyAV has the codec's cuvid decoder and it opens,
else cpu). Decoding runs on a thread per stream; each frame's decode call is timed, frames that
arrive while `BACKLOG` wait are dropped (in `all` until the next keyframe: the chain of
references is broken), and frames the decoder refuses are undecodable.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

import av

from render_server.tools.measure.frames import ObservedFrame, payload_format
from render_server.tools.stats import percentiles

NVDEC: Final = {"H264": "h264_cuvid", "VP8": "vp8_cuvid", "AV1": "av1_cuvid"}
BACKLOG: Final = 256  # frames waiting for the decoder, per stream


class DecoderUnavailable(ValueError):
    """The decoder asked for does not exist here (a usage error, before the run)."""


def _opens(name: str) -> bool:
    try:
        context = av.CodecContext.create(name, "r")
        context.open()
    except (av.FFmpegError, OSError, ValueError):
        return False
    del context
    return True


@functools.cache
def pick_decoder(choice: str, codec: str) -> tuple[str, str]:
    """(PyAV decoder name, "cpu" or "nvdec") for `codec` under `--decoder choice`; raises
    `DecoderUnavailable` when `nvdec` is asked for and cannot run here."""
    cpu = payload_format(codec).decoder
    if cpu is None:
        raise DecoderUnavailable(f"no decoder for {codec}")
    if choice == "cpu":
        return cpu, "cpu"
    nvdec = NVDEC.get(codec.upper())
    if nvdec is not None and nvdec in av.codecs_available and _opens(nvdec):
        return nvdec, "nvdec"
    if choice == "auto":
        return cpu, "cpu"
    if nvdec is None or nvdec not in av.codecs_available:
        raise DecoderUnavailable(f"--decoder nvdec: this PyAV has no NVDEC decoder for {codec}")
    raise DecoderUnavailable(
        f"--decoder nvdec: {nvdec} does not open here (no NVIDIA GPU or driver); "
        "use --decoder cpu or auto"
    )


@dataclass
class DecodeStats:
    offered: int = 0  # frames handed to the decoder
    decoded: int = 0  # pictures it gave
    undecodable: int = 0  # frames it refused
    dropped: int = 0  # frames it never got: behind, or their chain of references broken
    sizes: dict[str, int] = field(default_factory=dict)  # "WxH" → pictures
    decode_ms: list[float] = field(default_factory=list)

    def as_dict(self, decoder: str, kind: str, mode: str) -> dict[str, Any]:
        timing = percentiles(self.decode_ms)
        return {
            "decoder": decoder, "kind": kind, "mode": mode, "offered": self.offered,
            "decoded": self.decoded, "undecodable": self.undecodable, "dropped": self.dropped,
            # the names the report's decode check reads
            "errors": self.undecodable, "sizes": dict(sorted(self.sizes.items())),
            "decode_ms": None if timing is None else
            {k: timing[k] for k in ("count", "p50", "p95", "p99")},
        }  # fmt: skip


class StreamDecoder:
    """Decodes the frames a stream's assembler passes on (`offer`), on a thread of its own."""

    def __init__(self, mode: str, decoder: str, kind: str) -> None:
        self.mode, self.decoder, self.kind = mode, decoder, kind
        self.stats = DecodeStats()
        self._queue: queue.Queue[tuple[bytes, bool] | None] = queue.Queue(BACKLOG)
        self._chained = False  # "all": the frames so far reach back to a keyframe
        self._thread = threading.Thread(target=self._run, name="loadtest-decoder", daemon=True)
        self._thread.start()

    def offer(self, frame: ObservedFrame, access_unit: bytes) -> None:
        """Each frame the assembler closed; `access_unit` empty when it kept no bytes (not
        sampled, or incomplete). Never blocks."""
        if self.mode == "all":
            if not access_unit or not (frame.keyframe or self._chained):
                self._chained = False
                self.stats.dropped += 1
                return
            self._chained = True
        elif not access_unit:
            return
        try:
            self._queue.put_nowait((access_unit, frame.keyframe))
        except queue.Full:
            self.stats.dropped += 1
            self._chained = False
        else:
            self.stats.offered += 1

    def close(self, timeout: float = 10.0) -> None:
        """Finish the waiting frames and stop the thread."""
        self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def summary(self) -> dict[str, Any]:
        return self.stats.as_dict(self.decoder, self.kind, self.mode)

    def _run(self) -> None:
        context: Any = None
        stats = self.stats
        while (item := self._queue.get()) is not None:
            access_unit, keyframe = item
            if context is None or (keyframe and self.mode != "all"):
                context = av.CodecContext.create(self.decoder, "r")
                context.thread_count = 1  # each picture out of the call that decoded it
                if self.decoder == "libdav1d":
                    context.options = {"max_frame_delay": "1"}
            started = time.perf_counter()
            try:
                pictures = context.decode(av.Packet(access_unit))
            except av.FFmpegError:
                stats.undecodable += 1
                continue
            stats.decode_ms.append((time.perf_counter() - started) * 1000.0)
            for picture in pictures:
                stats.decoded += 1
                size = f"{picture.width}x{picture.height}"
                stats.sizes[size] = stats.sizes.get(size, 0) + 1
