"""Where the time goes: each frame's and each input's latency split into stages.

The worker sends, on the `input` data channel, a `timing` record per frame (`protocol.timing`):
when the input it reflects arrived, when its render started and ended, when its encode ended,
when it was handed to aiortc and when its last RTP packet left. The client knows when it sent
each input and when each frame's last packet arrived. A `ClockOffset` from ping/pong round trips
puts both on the worker's clock; a `LatencyMatcher` pairs records and frames by RTP timestamp and
splits each frame's time into stages that add up to the total exactly:

    glass-to-glass (frame start → last packet in) = render + encode + send + network
    input-to-frame (input sent → last packet in)  = input + wait + render + encode + send + network
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from render_server.protocol.timing import TimingRecord
from render_server.tools.measure.clock import ClockOffset
from render_server.tools.measure.frames import ObservedFrame
from render_server.tools.measure.matching import FrameMatcher
from render_server.tools.stats import percentiles

FRAME_STAGES: Final = ("render", "encode", "send", "network")
INPUT_STAGES: Final = ("input", "wait", *FRAME_STAGES)


@dataclass(frozen=True, slots=True)
class FrameBreakdown:
    """One frame, from its start on the worker to its last packet in (worker ms)."""

    rtp: int
    render: float
    encode: float
    send: float
    network: float
    total: float  # glass-to-glass
    keyframe: bool
    size: int


@dataclass(frozen=True, slots=True)
class InputBreakdown:
    """One input, from the client sending it to the last packet in of the first frame that
    reflects it. `input` ends when the frame's newest input arrived: this input's own arrival,
    or a later one's where the worker took several into one frame."""

    seq: int
    input: float
    wait: float
    render: float
    encode: float
    send: float
    network: float
    total: float  # input-to-frame


def frame_breakdown(record: TimingRecord, arrived_ms: float) -> FrameBreakdown:
    """`arrived_ms`: the frame's last packet in, on the worker's clock."""
    return FrameBreakdown(
        record.rtp,
        record.rendered_ms - record.start_ms,
        record.encoded_ms - record.rendered_ms,
        record.sent_ms - record.encoded_ms,
        arrived_ms - record.sent_ms,
        arrived_ms - record.start_ms,
        record.keyframe,
        record.size,
    )


def input_breakdown(
    seq: int, sent_ms: float, record: TimingRecord, arrived_ms: float
) -> InputBreakdown:
    """`sent_ms` and `arrived_ms` on the worker's clock; `record` reflects input `seq`."""
    if record.input_ms is None or record.seq < seq:
        raise ValueError(f"frame {record.rtp} does not reflect input {seq}")
    frame = frame_breakdown(record, arrived_ms)
    return InputBreakdown(
        seq,
        record.input_ms - sent_ms,
        record.start_ms - record.input_ms,
        frame.render,
        frame.encode,
        frame.send,
        frame.network,
        arrived_ms - sent_ms,
    )


class LatencyMatcher(FrameMatcher):
    """The latency client's use of the matcher: keeps everything it is given (records, frames,
    input send times, pairs) for `report()`. Meant for runs of seconds to minutes."""

    def __init__(self, clock: ClockOffset | None = None) -> None:
        super().__init__(clock)
        self.records: dict[int, TimingRecord] = {}
        self.frames: dict[int, ObservedFrame] = {}
        self.inputs: dict[int, float] = {}  # seq → client ms sent
        self.matches: dict[int, tuple[TimingRecord, ObservedFrame]] = {}  # by RTP timestamp

    def add_record(self, record: TimingRecord) -> None:
        self.records[record.rtp] = record
        super().add_record(record)

    def add_frame(self, frame: ObservedFrame) -> None:
        self.frames[frame.rtp] = frame
        super().add_frame(frame)

    def matched(self, record: TimingRecord, frame: ObservedFrame) -> None:
        self.matches[record.rtp] = (record, frame)

    def input_sent(self, seq: int, client_ms: float) -> None:
        self.inputs[seq] = client_ms

    def pairs(self) -> list[tuple[TimingRecord, ObservedFrame]]:
        """Records with a complete observed frame, in the worker's frame order."""
        matched = [(record, frame) for record, frame in self.matches.values() if frame.complete]
        return sorted(matched, key=lambda pair: pair[0].start_ms)

    def frame_breakdowns(self) -> list[FrameBreakdown]:
        to_worker = self.clock.to_worker
        return [frame_breakdown(r, to_worker(f.last_ms)) for r, f in self.pairs()]

    def input_breakdowns(self) -> list[InputBreakdown]:
        """For each input sent, the first frame (by the records) that reflects it, where that
        frame arrived complete."""
        to_worker = self.clock.to_worker
        ordered = sorted(self.records.values(), key=lambda record: record.start_ms)
        out = []
        i, newest = 0, -1
        for seq in sorted(self.inputs):
            while i < len(ordered) and newest < seq:
                newest = max(newest, ordered[i].seq)
                i += 1
            if newest < seq:
                break  # no frame reflects it yet, nor any later input
            match = self.matches.get(ordered[i - 1].rtp)
            if match is not None and match[1].complete:
                record, frame = match
                sent = to_worker(self.inputs[seq])
                out.append(input_breakdown(seq, sent, record, to_worker(frame.last_ms)))
        return out

    def report(self) -> dict[str, Any]:
        """The summary: counts, the clock alignment, and percentiles of each stage."""
        frames = self.frame_breakdowns()
        inputs = self.input_breakdowns()
        clock = self.clock.summary()
        stages: dict[str, Any] = {
            "input": percentiles(b.input for b in inputs),
            "wait": percentiles(b.wait for b in inputs),
        }
        for stage in FRAME_STAGES:
            stages[stage] = percentiles(getattr(b, stage) for b in frames)
        observed = self.frames.values()
        return {
            "frames": len(frames),
            "records": len(self.records),
            "observed": len(self.frames),
            "unmatched_records": len(self.waiting_records),
            "unmatched_frames": len(self.waiting_frames),
            "incomplete_frames": sum(1 for f in observed if not f.complete),
            "lost_packets": sum(f.lost for f in observed),
            "keyframes": sum(1 for f in observed if f.keyframe),
            "bad_records": self.bad_timing,
            "inputs": len(self.inputs),
            "inputs_answered": len(inputs),
            "clock": clock,
            "glass_to_glass": percentiles(b.total for b in frames),
            "input_to_frame": percentiles(b.total for b in inputs),
            "stages": stages,
        }
