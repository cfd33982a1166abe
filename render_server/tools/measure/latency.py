"""Where the time goes: the worker's per-frame timing records matched with frames as they arrived.

The worker sends, on the `input` data channel, a `timing` record per frame (docs/data-channel.md):
when the input it reflects arrived, when its render started and ended, when its encode ended,
when it was handed to aiortc and when its last RTP packet left. The client knows when it sent
each input and when each frame's last packet arrived. A `ClockOffset` from ping/pong round trips
puts both on the worker's clock; a `LatencyMatcher` pairs records and frames by RTP timestamp and
splits each frame's time into stages that add up to the total exactly:

    glass-to-glass (frame start → last packet in) = render + encode + send + network
    input-to-frame (input sent → last packet in)  = input + wait + render + encode + send + network
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from render_server.tools.measure.frames import ObservedFrame
from render_server.transport.timing import now_ms

FRAME_STAGES: Final = ("render", "encode", "send", "network")
INPUT_STAGES: Final = ("input", "wait", *FRAME_STAGES)
PERCENTILES: Final = (50, 95, 99)
UINT32: Final = 1 << 32


@dataclass(frozen=True, slots=True)
class TimingRecord:
    """One frame's timing from the worker, in worker milliseconds."""

    rtp: int  # RTP timestamp of the frame, as on the wire
    seq: int  # the latest input applied before its camera snapshot; -1: none newer
    input_ms: float | None  # when that input arrived (None when seq is -1)
    r0: float  # render start: the frame's start
    r1: float  # render (and colour conversion) end
    e1: float  # encode end
    h: float  # handed to aiortc's sender
    s: float  # its last RTP packet handed to the DTLS transport
    size: int  # encoded bytes
    keyframe: bool

    @classmethod
    def parse(cls, row: Any) -> TimingRecord:
        """A record from its wire form `[rtp, seq, input, r0, r1, e1, h, s, bytes, key]`."""
        if not isinstance(row, list | tuple) or len(row) != 10:
            raise ValueError("a timing record is a list of 10 values")
        rtp, seq, input_ms, *times, size, key = row
        if not _is_int(rtp) or not 0 <= rtp < UINT32:
            raise ValueError("`rtp` must be a uint32")
        if not _is_int(seq) or seq < -1:
            raise ValueError("`seq` must be an integer ≥ -1")
        if input_ms is not None and not _is_number(input_ms):
            raise ValueError("`input` must be a number or null")
        if not all(_is_number(t) for t in times):
            raise ValueError("the stage times must be finite numbers")
        if not _is_int(size) or size < 0 or key not in (0, 1, True, False):
            raise ValueError("`bytes` must be a count and `key` 0 or 1")
        r0, r1, e1, h, s = (float(t) for t in times)
        return cls(
            rtp,
            seq,
            None if input_ms is None or seq < 0 else float(input_ms),
            r0,
            r1,
            e1,
            h,
            s,
            size,
            bool(key),
        )


def parse_timing(message: dict[str, Any]) -> list[TimingRecord]:
    """The records of a `{"type": "timing", "frames": [...]}` message."""
    frames = message.get("frames")
    if message.get("type") != "timing" or not isinstance(frames, list):
        raise ValueError("not a timing message")
    return [TimingRecord.parse(row) for row in frames]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True, slots=True)
class ClockSample:
    sent_ms: float  # client clock
    worker_ms: float
    received_ms: float  # client clock

    @property
    def rtt(self) -> float:
        return self.received_ms - self.sent_ms

    @property
    def offset(self) -> float:
        """worker − client, assuming the pong took half the round trip."""
        return self.worker_ms - (self.sent_ms + self.received_ms) / 2


MAX_PENDING_PINGS = 64
PING_BURST: Final = 5  # pings at the start, PING_BURST_GAP_S apart, before the steady ones
PING_BURST_GAP_S: Final = 0.02


class ClockOffset:
    """Worker clock − client clock, from the ping/pong with the smallest round trip among the
    last `window`: the one least delayed on either leg, so the least skewed."""

    def __init__(self, window: int = 20) -> None:
        self.samples: deque[ClockSample] = deque(maxlen=window)
        self._best: ClockSample | None = None  # the smallest round trip among `samples`
        self._pending: dict[int, float] = {}  # ping id → when it left
        self._next_id = 0

    def ping(self, now_ms: float) -> dict[str, Any]:
        """The next `ping` message for the data channel, remembered until its pong."""
        self._next_id += 1
        self._pending[self._next_id] = now_ms
        if len(self._pending) > MAX_PENDING_PINGS:  # pongs that never came
            del self._pending[next(iter(self._pending))]
        return {"type": "ping", "id": self._next_id, "t": now_ms}

    def pong(self, message: dict[str, Any], received_ms: float) -> bool:
        """Take the worker's `pong` (received at `received_ms`); False if it answers no ping
        of ours."""
        ping_id, worker = message.get("id"), message.get("w")
        sent = self._pending.pop(ping_id, None) if isinstance(ping_id, int) else None
        if sent is None or isinstance(worker, bool) or not isinstance(worker, int | float):
            return False
        self.add(sent, float(worker), received_ms)
        return True

    def add(self, sent_ms: float, worker_ms: float, received_ms: float) -> None:
        if received_ms < sent_ms:
            raise ValueError("a pong cannot arrive before its ping left")
        self.samples.append(ClockSample(sent_ms, worker_ms, received_ms))
        # once per pong, not per frame: the best may just have left the window
        self._best = min(self.samples, key=lambda sample: sample.rtt)

    @property
    def best(self) -> ClockSample:
        if self._best is None:
            raise LookupError("no ping answered yet: the clocks are not aligned")
        return self._best

    @property
    def offset(self) -> float:
        return self.best.offset

    def to_worker(self, client_ms: float) -> float:
        return client_ms + self.offset

    def summary(self) -> dict[str, float]:
        """The alignment in use, for a report: its offset and round trip, and the samples."""
        best = self.best
        return {
            "offset_ms": round(best.offset, 3),
            "rtt_ms": round(best.rtt, 3),
            "samples": len(self.samples),
        }


async def ping_burst(send: Callable[[dict[str, Any]], None], clock: ClockOffset) -> None:
    """`PING_BURST` pings through `send`, `PING_BURST_GAP_S` apart: a first alignment."""
    for _ in range(PING_BURST):
        send(clock.ping(now_ms()))
        await asyncio.sleep(PING_BURST_GAP_S)


async def ping_every(
    send: Callable[[dict[str, Any]], None], clock: ClockOffset, interval: float
) -> None:
    """A ping through `send` every `interval` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval)
        send(clock.ping(now_ms()))


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
        record.r1 - record.r0,
        record.e1 - record.r1,
        record.s - record.e1,
        arrived_ms - record.s,
        arrived_ms - record.r0,
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
        record.r0 - record.input_ms,
        frame.render,
        frame.encode,
        frame.send,
        frame.network,
        arrived_ms - sent_ms,
    )


def percentiles(values: Iterable[float]) -> dict[str, float] | None:
    """p50/p95/p99 (linear between ranks), mean and count; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    out = {f"p{q}": round(_rank(ordered, q / 100), 3) for q in PERCENTILES}
    out["mean"] = round(sum(ordered) / len(ordered), 3)
    out["count"] = len(ordered)
    return out


def _rank(ordered: Sequence[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class LatencyMatcher:
    """Collects timing records, observed frames, input send times and ping samples; `report()`
    pairs them up. Keeps everything it is given: meant for runs of seconds to minutes."""

    def __init__(self, clock: ClockOffset | None = None) -> None:
        self.clock = clock or ClockOffset()
        self.records: dict[int, TimingRecord] = {}
        self.frames: dict[int, ObservedFrame] = {}
        self.inputs: dict[int, float] = {}  # seq → client ms sent
        self.bad_records = 0

    def add_timing(self, message: dict[str, Any]) -> None:
        try:
            records = parse_timing(message)
        except ValueError:
            self.bad_records += 1
            return
        for record in records:
            self.records[record.rtp] = record

    def add_frame(self, frame: ObservedFrame) -> None:
        self.frames[frame.rtp] = frame

    def input_sent(self, seq: int, client_ms: float) -> None:
        self.inputs[seq] = client_ms

    def pairs(self) -> list[tuple[TimingRecord, ObservedFrame]]:
        """Records with a complete observed frame, in the worker's frame order."""
        matched = [
            (record, frame)
            for rtp, record in self.records.items()
            if (frame := self.frames.get(rtp)) is not None and frame.complete
        ]
        return sorted(matched, key=lambda pair: pair[0].r0)

    def frame_breakdowns(self) -> list[FrameBreakdown]:
        to_worker = self.clock.to_worker
        return [frame_breakdown(r, to_worker(f.last_ms)) for r, f in self.pairs()]

    def input_breakdowns(self) -> list[InputBreakdown]:
        """For each input sent, the first frame (by the records) that reflects it, where that
        frame arrived complete."""
        to_worker = self.clock.to_worker
        ordered = sorted(self.records.values(), key=lambda record: record.r0)
        out = []
        i, newest = 0, -1
        for seq in sorted(self.inputs):
            while i < len(ordered) and newest < seq:
                newest = max(newest, ordered[i].seq)
                i += 1
            if newest < seq:
                break  # no frame reflects it yet, nor any later input
            record = ordered[i - 1]
            frame = self.frames.get(record.rtp)
            if frame is not None and frame.complete:
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
            "unmatched_records": sum(1 for rtp in self.records if rtp not in self.frames),
            "unmatched_frames": sum(1 for rtp in self.frames if rtp not in self.records),
            "incomplete_frames": sum(1 for f in observed if not f.complete),
            "lost_packets": sum(f.lost for f in observed),
            "keyframes": sum(1 for f in observed if f.keyframe),
            "bad_records": self.bad_records,
            "inputs": len(self.inputs),
            "inputs_answered": len(inputs),
            "clock": clock,
            "glass_to_glass": percentiles(b.total for b in frames),
            "input_to_frame": percentiles(b.total for b in inputs),
            "stages": stages,
        }
