"""The worker's timing records paired with the frames as they arrived, by RTP timestamp.

Either half may come first. A record usually comes after its frame (the worker sends it once the
frame's last packet has left, batched every ~100 ms), but a frame slowed on the network, or
held back while NACKs repair it, closes after its record is in. A record whose frame never
closes (lost, or sent before the receiver was watching) and a frame without a record (sent
before the data channel opened, or whose record is still on the way) wait for ever: `limit`
bounds how many may.
"""

from __future__ import annotations

from typing import Any, TypeVar

from render_server.protocol.timing import TimingRecord, now_ms, parse_timing
from render_server.tools.measure.clock import ClockOffset
from render_server.tools.measure.frames import ObservedFrame
from render_server.tools.signaling_client import json_object

T = TypeVar("T")


class FrameMatcher:
    """Pairs timing records with observed frames, in whichever order they come, and calls
    `matched` with each pair (complete frame or not); a subclass says what a pair is for.

    It also takes what the worker sends a measuring client (`receive`): timing records, and the
    pongs that align `clock`. With `limit`, at most that many records and that many frames wait
    for their other half, the oldest given up first."""

    def __init__(self, clock: ClockOffset | None = None, limit: int | None = None) -> None:
        self.clock = clock or ClockOffset()
        self.limit = limit
        self.waiting_records: dict[int, TimingRecord] = {}  # rtp → record, no frame yet
        self.waiting_frames: dict[int, ObservedFrame] = {}  # rtp → frame, no record yet
        self.record_count = 0
        self.bad_timing = 0  # `timing` messages refused as malformed

    def receive(self, data: str | bytes, arrived_ms: float | None = None) -> dict[str, Any] | None:
        """A data-channel message from the worker: a `pong` aligns the clock, a `timing` one is
        matched; any other JSON object is returned for the caller, None where nothing is left.
        `arrived_ms`, where known: when the message's datagram reached the host (the kernel's
        stamp), which a busy or sleeping loop reads later (`ClockOffset.pong`)."""
        received = now_ms()  # before parsing: the pong's arrival, as exact as it gets here
        message = json_object(data)
        if message is None:
            return None
        kind = message.get("type")
        if kind == "pong":
            self.clock.pong(message, received, arrived_ms)
        elif kind == "timing":
            self.add_timing(message)
        else:
            return message
        return None

    def add_timing(self, message: dict[str, Any]) -> None:
        try:
            records = parse_timing(message)
        except ValueError:
            self.bad_timing += 1
            return
        for record in records:
            self.add_record(record)

    def add_record(self, record: TimingRecord) -> None:
        self.record_count += 1
        frame = self.waiting_frames.pop(record.rtp, None)
        if frame is None:
            self._wait(self.waiting_records, record.rtp, record)
        else:
            self.matched(record, frame)

    def add_frame(self, frame: ObservedFrame) -> None:
        record = self.waiting_records.pop(frame.rtp, None)
        if record is None:
            self._wait(self.waiting_frames, frame.rtp, frame)
        else:
            self.matched(record, frame)

    def matched(self, record: TimingRecord, frame: ObservedFrame) -> None:
        """A record met its frame; `frame.complete` says whether its time means anything."""

    def _wait(self, waiting: dict[int, T], rtp: int, half: T) -> None:
        waiting[rtp] = half
        if self.limit is not None and len(waiting) > self.limit:
            del waiting[next(iter(waiting))]  # the oldest: dicts keep insertion order
