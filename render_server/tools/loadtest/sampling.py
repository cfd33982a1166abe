"""Which frames a load-test stream keeps the bytes of, to decode: a keyframe now and then.

Depayloading every frame would cost the harness more than receiving it, so a stream keeps a
keyframe's payloads once at least `every` frames have closed since the last sample, told by
its first packet in the stream's payload format. `SamplingAssembler` does that inside the
lean and full receivers' frame assembly; `KeyframeSampler` is the counting receiver's
`FrameSampler`, which sees only the frames it asks for, each whole in an assembler of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from render_server.tools.measure.frames import FrameAssembler, ObservedFrame, payload_format

Sampled = Callable[[ObservedFrame, bytes], None]


class SamplingAssembler(FrameAssembler):
    """A `FrameAssembler` that keeps payload bytes only for the frames it samples."""

    def __init__(self, on_frame: Sampled, every: int) -> None:
        super().__init__(self._counted, keep_payload=False)
        self.every = every
        self.since_sample = every  # the first keyframe is sampled
        self._deliver = on_frame
        self._last_timestamp: int | None = None

    def _counted(self, frame: ObservedFrame, access_unit: bytes) -> None:
        """Count the frames closed since the last sample (one with bytes), then pass it on."""
        self.since_sample = 0 if access_unit else self.since_sample + 1
        self._deliver(frame, access_unit)

    def add(self, seq: int, timestamp: int, marker: int, payload: bytes, arrival_ms: float) -> None:
        if timestamp != self._last_timestamp:  # (likely) a frame's first packet
            self._last_timestamp = timestamp
            self.keep_payload = self.since_sample >= self.every and self.format.keyframe(payload)
        super().add(seq, timestamp, marker, payload, arrival_ms)


class KeyframeSampler:
    """Takes a keyframe once `every` frames have been `counted` since the last one taken
    whole; `on_sample` gets it (with its access unit, or `b""` where a packet was missing)."""

    def __init__(self, on_sample: Sampled, every: int, codec: str) -> None:
        self.every = every
        self.since_sample = every  # the first keyframe is sampled
        self.last_rtp: int | None = None  # the RTP timestamp of the last frame taken whole
        self._on_sample = on_sample
        self._format = payload_format(codec)
        self._assembler: FrameAssembler | None = None

    def counted(self) -> None:
        """A frame went by (counted, whether taken or not)."""
        self.since_sample += 1

    def wants(self) -> bool:
        return self.since_sample >= self.every

    def begin(self, payload: bytes) -> bool:
        if not self._format.keyframe(payload):
            return False
        self._assembler = FrameAssembler(self._closed, keep_payload=True, codec=self._format.codec)
        return True

    def add(self, seq: int, timestamp: int, marker: int, payload: bytes, arrival_ms: float) -> None:
        if self._assembler is not None:
            self._assembler.add(seq, timestamp, marker, payload, arrival_ms)

    def end(self) -> None:
        if self._assembler is not None:
            self._assembler.flush()  # closes it incomplete where a packet never came
            self._assembler = None

    def _closed(self, frame: ObservedFrame, access_unit: bytes) -> None:
        if access_unit:
            self.since_sample = 0
            self.last_rtp = frame.rtp
        self._on_sample(frame, access_unit)
