"""One load-test stream's frame latency: its start on the worker to its last packet in."""

from __future__ import annotations

from typing import Final

from render_server.protocol.timing import TimingRecord
from render_server.tools.measure.frames import ObservedFrame
from render_server.tools.measure.matching import FrameMatcher

MAX_WAITING: Final = 512  # records, and frames, waiting for their other half


class FrameLatencies(FrameMatcher):
    """The load test's use of the matcher, for streams of many minutes: a bounded number of
    records and frames wait, and each complete frame matched leaves only two times.

    A latency needs the clock offset, which improves as pongs come: the live display gets each
    frame's with the offset of the moment (`take_recent`), the report every frame's with the
    offset at the end (`series`)."""

    def __init__(self) -> None:
        super().__init__(limit=MAX_WAITING)
        self.pairs: list[tuple[float, float]] = []  # (worker start, client ms last packet in)
        self._recent: list[float] = []

    def matched(self, record: TimingRecord, frame: ObservedFrame) -> None:
        if not frame.complete:
            return  # its last packet in is not when the frame arrived
        self.pairs.append((record.start_ms, frame.last_ms))
        if self.clock.samples:
            self._recent.append(frame.last_ms + self.clock.offset - record.start_ms)

    def take_recent(self) -> list[float]:
        """The latencies matched since the last call (ms)."""
        recent, self._recent = self._recent, []
        return recent

    def series(self) -> list[tuple[float, float]]:
        """(client ms the frame arrived, latency ms) of every frame matched so far, with the
        clock offset as it is now; LookupError before any pong."""
        offset = self.clock.offset
        return [(arrived, round(arrived + offset - start, 3)) for start, arrived in self.pairs]
