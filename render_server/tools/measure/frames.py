"""Frames as they arrive: assembled on the RTP marker bit, timed per packet, decoded on a sample.

aiortc's receiver hands a frame to its decoder only when the first packet of the *next* frame
arrives, which adds a whole frame interval to anything timed at `track.recv()`. A
`FrameAssembler` is fed every RTP packet (sequence number, timestamp, marker, payload) with its
arrival time and closes a frame at its marker-bit packet instead. transport/receiver_hook.py
feeds one from an `RTCRtpReceiver` (`observe_receiver(receiver, assembler.add,
on_codec=assembler.set_codec)`), ahead of aiortc's own handling, which still runs unchanged
(NACK, REMB, RTCP receiver reports, PLI on loss).

The stream may be H.264, VP8 or AV1, whichever was negotiated: a `PayloadFormat` says how each
one's payloads tell a keyframe and make the bytes its decoder takes. Per packet the assembler
does a few integer operations and, until a frame is known to be a keyframe, looks at the
payload's first bytes; payload bytes are kept only while a `FrameDecoder` wants them.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import av
from aiortc.codecs.h264 import H264PayloadDescriptor
from aiortc.codecs.vpx import VpxPayloadDescriptor

from render_server.transport.av1_rtp import av1_payload_starts_keyframe, depacketize_av1

NAL_IDR: Final = 5
NAL_SPS: Final = 7
NAL_STAP_A: Final = 24
NAL_FU_A: Final = 28
SEQ_MOD: Final = 1 << 16
MAX_PENDING: Final = 8  # frames waiting for missing packets before they are given up as lost


def h264_keyframe_nal(payload: bytes) -> bool:
    """Whether an H.264 RTP payload (RFC 6184) carries an IDR slice or an SPS: single NAL unit,
    STAP-A aggregate or the first fragment of an FU-A."""
    if not payload:
        return False
    nal_type = payload[0] & 0x1F
    if nal_type == NAL_FU_A:
        return len(payload) > 1 and bool(payload[1] & 0x80) and (payload[1] & 0x1F) in (5, 7)
    if nal_type == NAL_STAP_A:
        pos = 1
        while pos + 2 < len(payload):
            size = (payload[pos] << 8) | payload[pos + 1]
            if size and (payload[pos + 2] & 0x1F) in (NAL_IDR, NAL_SPS):
                return True
            pos += 2 + size
        return False
    return nal_type in (NAL_IDR, NAL_SPS)


def vp8_keyframe(payload: bytes) -> bool:
    """Whether a VP8 RTP payload (RFC 7741) begins a key frame: the start of partition 0 (S=1,
    PID=0) whose VP8 payload header has P (inverse key frame flag) clear."""
    if len(payload) < 2 or payload[0] & 0x17 != 0x10:  # S set, PID 0: a frame's first packet
        return False
    try:
        _, data = VpxPayloadDescriptor.parse(payload)
    except ValueError:
        return False
    return bool(data) and not data[0] & 0x01


def _h264_depayload(payloads: list[bytes]) -> bytes:
    """RTP payloads of one frame, in sequence order → one Annex B access unit."""
    parts = []
    for payload in payloads:
        with contextlib.suppress(ValueError):  # an unsupported NAL type: the decoder will say
            parts.append(H264PayloadDescriptor.parse(payload)[1])
    return b"".join(parts)


def _vp8_depayload(payloads: list[bytes]) -> bytes:
    """RTP payloads of one frame → the VP8 frame: the payload descriptors stripped."""
    return b"".join(VpxPayloadDescriptor.parse(payload)[1] for payload in payloads)


def _never(payload: bytes) -> bool:
    return False


@dataclass(frozen=True, slots=True)
class PayloadFormat:
    """How one codec's RTP payloads are read."""

    codec: str  # its name in SDP: "H264", "VP8", "AV1"
    keyframe: Callable[[bytes], bool]  # this payload begins a keyframe
    depayload: Callable[[list[bytes]], bytes]  # a frame's payloads in order → decoder input
    decoder: str | None  # the PyAV decoder, None where there is none


PAYLOAD_FORMATS: Final = {
    "H264": PayloadFormat("H264", h264_keyframe_nal, _h264_depayload, "h264"),
    "VP8": PayloadFormat("VP8", vp8_keyframe, _vp8_depayload, "vp8"),
    "AV1": PayloadFormat("AV1", av1_payload_starts_keyframe, depacketize_av1, "libdav1d"),
}


def payload_format(codec: str) -> PayloadFormat:
    """The format of `codec` (SDP name, any case). Another codec is still counted in frames,
    but never as keyframes, and not decoded."""
    known = PAYLOAD_FORMATS.get(codec.upper())
    return known if known is not None else PayloadFormat(codec, _never, b"".join, None)


@dataclass(slots=True)
class ObservedFrame:
    """One video frame as it arrived. Times are `time.monotonic()` in milliseconds."""

    rtp: int  # the RTP timestamp, as on the wire
    first_ms: float  # arrival of its first packet (in arrival order)
    last_ms: float  # arrival of the packet that completed it (the marker, or a late one)
    size: int  # payload bytes received
    packets: int  # packets received
    lost: int  # packets missing when it was closed
    keyframe: bool
    complete: bool
    index: int = 0  # position in the stream, counting closed frames from 0
    codec: str = "H264"  # the payload format's name (`PayloadFormat.codec`)


@dataclass(slots=True)
class _Building:
    rtp: int
    first_ms: float
    last_ms: float
    first_seq: int  # the lowest sequence number seen (unwrapped)
    born: int  # how many frames had begun when this one did, itself included
    next_first: int | None = None  # the first sequence number of the frame begun after it
    size: int = 0
    packets: int = 0
    keyframe: bool = False
    end_seq: int | None = None  # the marker packet's (unwrapped)
    seqs: set[int] = field(default_factory=set)
    payloads: dict[int, bytes] | None = None


@dataclass
class AssemblerStats:
    packets: int = 0
    duplicates: int = 0  # retransmitted or repeated packets of frames already counted
    late: int = 0  # packets of frames already closed
    frames: int = 0
    incomplete: int = 0
    lost_packets: int = 0
    malformed: int = 0  # complete frames whose payloads did not depayload (no bytes passed on)


class FrameAssembler:
    """Builds `ObservedFrame`s from RTP packets of one video stream, of `codec` (H264, VP8,
    AV1) until `set_codec` says otherwise.

    A frame spans the packets after the previous frame's marker up to its own marker. It closes
    when all of them are in: at the marker when packets come in order, at the last missing one
    when they are reordered. A frame still missing packets when `MAX_PENDING` newer frames have
    closed is closed incomplete, its missing packets counted as lost. `on_frame` gets each
    closed frame and, where `keep_payload` is set, what its decoder takes (H.264: an Annex B
    access unit, VP8: the frame, AV1: a temporal unit), else `b""`.
    """

    def __init__(
        self,
        on_frame: Callable[[ObservedFrame, bytes], None],
        keep_payload: bool = False,
        codec: str = "H264",
    ) -> None:
        self.on_frame = on_frame
        self.keep_payload = keep_payload
        self.format = payload_format(codec)
        self.stats = AssemblerStats()
        self._building: dict[int, _Building] = {}
        self._closed: dict[int, None] = {}  # recent closed timestamps, oldest first
        self._last_seq: int | None = None  # unwrapped, highest seen
        self._last_end: int | None = None  # unwrapped sequence number of the last marker seen
        self._begun = 0

    def set_codec(self, codec: str) -> None:
        """The stream's codec from now on (the receiver hook's `on_codec`, once negotiated)."""
        if codec.upper() != self.format.codec.upper():
            self.format = payload_format(codec)

    def add(self, seq: int, timestamp: int, marker: int, payload: bytes, arrival_ms: float) -> None:
        self.stats.packets += 1
        useq = self._unwrap(seq)
        if timestamp in self._closed:
            self.stats.late += 1
            return
        frame = self._building.get(timestamp)
        if frame is None:
            first = useq
            last_end = self._last_end
            if (
                last_end is not None
                and last_end < useq
                and all(
                    f.end_seq is not None and f.end_seq <= last_end for f in self._building.values()
                )
            ):
                first = last_end + 1  # the packets since the last marker are this frame's
            self._begun += 1
            for waiting in self._building.values():
                if waiting.next_first is None and waiting.first_seq < first:
                    waiting.next_first = first  # where it ends if its marker never comes
            if self._building:
                self._expire()
            frame = _Building(timestamp, arrival_ms, arrival_ms, first, self._begun)
            if self.keep_payload:
                frame.payloads = {}
            self._building[timestamp] = frame
        elif useq < frame.first_seq:
            frame.first_seq = useq
        if useq in frame.seqs:
            self.stats.duplicates += 1
            return
        frame.seqs.add(useq)
        if frame.payloads is not None:
            frame.payloads[useq] = payload
        frame.packets += 1
        frame.size += len(payload)
        frame.last_ms = arrival_ms
        if not frame.keyframe and self.format.keyframe(payload):
            frame.keyframe = True
        if marker:
            frame.end_seq = useq
            if self._last_end is None or useq > self._last_end:
                self._last_end = useq
        if frame.end_seq is not None and frame.packets >= frame.end_seq - frame.first_seq + 1:
            self._close(frame, frame.end_seq)

    def flush(self) -> None:
        """Close every frame still waiting, incomplete."""
        self._expire(everything=True)

    # -- internals ---------------------------------------------------------------------------

    def _unwrap(self, seq: int) -> int:
        if self._last_seq is None:
            self._last_seq = seq + SEQ_MOD  # room below for reordered first packets
            return self._last_seq
        delta = (seq - self._last_seq) % SEQ_MOD
        if delta >= SEQ_MOD // 2:
            delta -= SEQ_MOD
        useq = self._last_seq + delta
        if useq > self._last_seq:
            self._last_seq = useq
        return useq

    def _expire(self, everything: bool = False) -> None:
        """Close, incomplete, the frames still waiting that began more than `MAX_PENDING` frames
        ago. A frame whose marker never came ends where the next one begins."""
        for frame in sorted(self._building.values(), key=lambda f: f.first_seq):
            if not everything and frame.born >= self._begun - MAX_PENDING:
                continue
            end = frame.end_seq
            if end is None:
                end = max(frame.seqs) if frame.next_first is None else frame.next_first - 1
            self._close(frame, end)

    def _close(self, frame: _Building, end_seq: int) -> None:
        del self._building[frame.rtp]
        self._closed[frame.rtp] = None
        if len(self._closed) > 64:
            del self._closed[next(iter(self._closed))]
        lost = max(0, end_seq - frame.first_seq + 1 - frame.packets)
        complete = lost == 0 and frame.end_seq is not None
        observed = ObservedFrame(
            frame.rtp,
            frame.first_ms,
            frame.last_ms,
            frame.size,
            frame.packets,
            lost,
            frame.keyframe,
            complete,
            self.stats.frames,
            self.format.codec,
        )
        self.stats.frames += 1
        if not complete:
            self.stats.incomplete += 1
            self.stats.lost_packets += lost
        access_unit = b""
        if frame.payloads is not None and complete:
            try:
                access_unit = self.format.depayload(
                    [frame.payloads[s] for s in sorted(frame.payloads)]
                )
            except ValueError:  # from the network: counted, and no bytes to decode
                self.stats.malformed += 1
        self.on_frame(observed, access_unit)


DecodeMode = Literal["none", "keyframes", "all"]


@dataclass
class DecodeStats:
    offered: int = 0  # access units handed to the decoder
    decoded: int = 0  # pictures it gave
    errors: int = 0  # access units it refused
    skipped: int = 0  # dropped because the decoder fell behind
    sizes: dict[tuple[int, int], int] = field(default_factory=dict)  # (width, height) → pictures

    def as_dict(self) -> dict[str, Any]:
        """For a report: the counts, and the pictures per size as `"WxH"`."""
        return {
            "offered": self.offered,
            "decoded": self.decoded,
            "errors": self.errors,
            "skipped": self.skipped,
            "sizes": {f"{w}x{h}": n for (w, h), n in sorted(self.sizes.items())},
        }


class FrameDecoder:
    """Decodes complete frames with PyAV on a thread of its own, to prove the stream is valid
    video of the expected size; each frame with its codec's decoder (`ObservedFrame.codec`).
    `mode`:

    - `"keyframes"`: each keyframe alone, in a fresh decoder (parameter sets and picture).
    - `"all"`: every frame from the first keyframe on, in order, in one decoder.

    There is no cheaper exact middle: the worker sends keyframes only on request, so every
    later frame refers back through all frames to the last keyframe, and decoding one frame in
    N means decoding them all. (Decoding a frame without its references is no check: libavcodec
    conceals what is missing and, for some such frames, gives no picture at all.)

    At most `backlog` frames wait; beyond that `"all"` stops until the next keyframe (its
    reference chain is broken) and counts what it skipped. `offer` never blocks.
    """

    def __init__(self, mode: DecodeMode = "keyframes", backlog: int = 64) -> None:
        if mode not in ("keyframes", "all"):
            raise ValueError(f"decode mode must be keyframes or all, not {mode!r}")
        self.mode = mode
        self.stats = DecodeStats()
        self._queue: queue.Queue[tuple[bytes, bool, str] | None] = queue.Queue(backlog)
        self._chained = False  # "all": the frames so far reach back to a keyframe
        self._thread = threading.Thread(target=self._run, name="frame-decoder", daemon=True)
        self._thread.start()

    def offer(self, frame: ObservedFrame, access_unit: bytes) -> None:
        """Called by the assembler for each closed frame (incomplete ones bring no bytes)."""
        if not access_unit:
            self._chained = False  # a lost frame breaks the chain of references
            return
        if frame.keyframe:
            self._chained = True
        elif self.mode == "keyframes" or not self._chained:
            return
        try:
            self._queue.put_nowait((access_unit, frame.keyframe, frame.codec))
        except queue.Full:
            self.stats.skipped += 1
            self._chained = False
        else:
            self.stats.offered += 1

    def close(self, timeout: float = 10.0) -> None:
        """Finish the waiting frames and stop the thread."""
        self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        context: Any = None
        decoding: str | None = None  # the codec `context` decodes
        while (item := self._queue.get()) is not None:
            access_unit, keyframe, codec = item
            if context is None or keyframe or codec != decoding:
                decoding, context = codec, _decoder(codec)
            if context is None:
                self.stats.errors += 1
                continue
            try:
                pictures = context.decode(av.Packet(access_unit))
            except av.FFmpegError:
                self.stats.errors += 1
                continue
            for picture in pictures:
                self.stats.decoded += 1
                size = (picture.width, picture.height)
                self.stats.sizes[size] = self.stats.sizes.get(size, 0) + 1


def _decoder(codec: str) -> Any:
    """A fresh PyAV decoder for `codec`, giving each picture out of the call that decoded it
    (frame threads, and dav1d's frame delay, would hold pictures back); None if there is none."""
    name = payload_format(codec).decoder
    if name is None:
        return None
    context = av.CodecContext.create(name, "r")
    context.thread_count = 1
    if name == "libdav1d":
        context.options = {"max_frame_delay": "1"}
    return context
