"""Per-frame timing records: the `timing` message's rows on the `input` data channel.

The worker writes one row per frame and a measuring client (the page's SDK, `tools/measure`,
the load test) reads them; docs/data-channel.md, "timing", is the reference:

    [rtp, seq, input, start, rendered, encoded, handed, sent, bytes, key]

Times are milliseconds on the worker's monotonic clock (`now_ms`); a client puts them on its own
by ping/pong on the same channel.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Final

ROW_LENGTH: Final = 10
RTP_MASK: Final = 0xFFFFFFFF  # RTP timestamps are uint32 and wrap


def now_ms() -> float:
    """The records' clock: `time.monotonic()` in milliseconds, one clock for a whole host."""
    return time.monotonic() * 1e3


@dataclass(frozen=True, slots=True)
class TimingRecord:
    """One frame's timing, in worker milliseconds."""

    rtp: int  # the frame's RTP timestamp, exactly as on the wire
    seq: int  # the newest input the frame shows; -1: none newer than the last frame's
    input_ms: float | None  # when that input arrived (None when seq is -1)
    start_ms: float  # the frame's start: its render (or the reuse of the last picture) begins
    rendered_ms: float  # render and colour conversion done
    encoded_ms: float
    handed_ms: float  # handed to aiortc's sender
    sent_ms: float  # its last RTP packet (marker bit) handed to the DTLS transport
    size: int  # encoded bytes
    keyframe: bool

    def row(self) -> list[Any]:
        """The wire form: times rounded to 1/100 ms, which is all a client can use."""
        r = round
        return [
            self.rtp, self.seq, None if self.input_ms is None else r(self.input_ms, 2),
            r(self.start_ms, 2), r(self.rendered_ms, 2), r(self.encoded_ms, 2),
            r(self.handed_ms, 2), r(self.sent_ms, 2), self.size, 1 if self.keyframe else 0,
        ]  # fmt: skip

    @classmethod
    def parse(cls, row: Any) -> TimingRecord:
        """A record from its wire form; ValueError for a malformed row."""
        # the rows as the worker writes them, checked in one expression: a load-test process
        # reads a few thousand a second (6 us each the general way below, 2 this way)
        if type(row) is list and len(row) == ROW_LENGTH:
            rtp, seq, input_ms, start, rendered, encoded, handed, sent, size, key = row
            if (
                type(rtp) is int and type(seq) is int and type(size) is int
                and type(start) is float and type(rendered) is float and type(encoded) is float
                and type(handed) is float and type(sent) is float
                and (input_ms is None or type(input_ms) is float)
                and 0 <= rtp <= RTP_MASK and seq >= -1 and size >= 0 and (key == 0 or key == 1)
                # a sum of finite floats is finite unless it overflows: then the way below
                and math.isfinite(start + rendered + encoded + handed + sent + (input_ms or 0.0))
            ):  # fmt: skip
                arrived = None if seq < 0 else input_ms
                return cls(
                    rtp, seq, arrived, start, rendered, encoded, handed, sent, size, key == 1
                )
        return cls._parse_any(row)

    @classmethod
    def _parse_any(cls, row: Any) -> TimingRecord:
        if not isinstance(row, list | tuple) or len(row) != ROW_LENGTH:
            raise ValueError(f"a timing record is a list of {ROW_LENGTH} values")
        rtp, seq, input_ms, *times, size, key = row
        if not _is_int(rtp) or not 0 <= rtp <= RTP_MASK:
            raise ValueError("`rtp` must be a uint32")
        if not _is_int(seq) or seq < -1:
            raise ValueError("`seq` must be an integer ≥ -1")
        if input_ms is not None and not _is_number(input_ms):
            raise ValueError("`input` must be a number or null")
        if not all(_is_number(t) for t in times):
            raise ValueError("the stage times must be finite numbers")
        if not _is_int(size) or size < 0 or key not in (0, 1, True, False):
            raise ValueError("`bytes` must be a count and `key` 0 or 1")
        start, rendered, encoded, handed, sent = (float(t) for t in times)
        # an `input` beside seq -1 names no input of this frame: dropped, not trusted
        arrived = None if input_ms is None or seq < 0 else float(input_ms)
        return cls(rtp, seq, arrived, start, rendered, encoded, handed, sent, size, bool(key))


def parse_timing(message: dict[str, Any]) -> list[TimingRecord]:
    """The records of a `{"type": "timing", "frames": [row, ...]}` message; ValueError for a
    message that is not one or holds a malformed row."""
    frames = message.get("frames")
    if message.get("type") != "timing" or not isinstance(frames, list):
        raise ValueError("not a timing message")
    return [TimingRecord.parse(row) for row in frames]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
