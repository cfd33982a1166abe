"""Recording a controller's inputs, and replaying them: regression tests on real sessions.

One JSON object a line, written before the call is passed on:

    {"init": [start, min, max, pacing_factor]}          the first line: how it was built
    {"t": send_time, "sent": [seq, size, send_time, cluster_or_null]}
    {"t": now, "feedback": [[seq, arrival_or_null], ...]}
    {"t": now, "remb": bps}
    {"t": now, "process": 1}
    {"bitrates": [min, max]}
    {"tolerance": fraction}

`next_probe` is not recorded: what the pacer pops changes no estimate, so the inputs above
replay to the same targets. Files may be gzip'd (`open_recording` reads and writes both).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterable, Sequence
from typing import IO, Any, Protocol, cast

from .controller import CongestionController
from .types import CongestionState, PacketFeedback, ProbeCluster, SentPacket


class _Writer(Protocol):
    def write(self, text: str, /) -> object: ...


def _dumps(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":")) + "\n"


class ControllerRecorder:
    """A CongestionController that writes down its inputs as it passes them on."""

    def __init__(self, controller: CongestionController, file: _Writer) -> None:
        self.controller = controller
        self._file = file
        c = controller
        self._write({"init": [c.start_bitrate, c.min_bitrate, c.max_bitrate, c.pacing_factor]})

    def _write(self, event: dict[str, Any]) -> None:
        self._file.write(_dumps(event))

    def on_packet_sent(self, packet: SentPacket) -> None:
        p = packet
        self._write({"t": p.send_time, "sent": [p.sequence, p.size, p.send_time, p.probe_cluster]})
        self.controller.on_packet_sent(packet)

    def on_feedback(self, now: float, feedback: Sequence[PacketFeedback]) -> None:
        self._write({"t": now, "feedback": [[f.sequence, f.arrival] for f in feedback]})
        self.controller.on_feedback(now, feedback)

    def on_remb(self, now: float, bitrate: int) -> None:
        self._write({"t": now, "remb": bitrate})
        self.controller.on_remb(now, bitrate)

    def set_loss_tolerance(self, fraction: float) -> None:
        self._write({"tolerance": fraction})
        self.controller.set_loss_tolerance(fraction)

    def set_bitrates(self, min_bitrate: int, max_bitrate: int) -> None:
        self._write({"bitrates": [min_bitrate, max_bitrate]})
        self.controller.set_bitrates(min_bitrate, max_bitrate)

    def forget_sent(self) -> None:  # not recorded: it changes no estimate, only memory
        self.controller.forget_sent()

    def process(self, now: float) -> None:
        self._write({"t": now, "process": 1})
        self.controller.process(now)

    def next_probe(self, now: float) -> ProbeCluster | None:
        return self.controller.next_probe(now)

    @property
    def target_bitrate(self) -> int:
        return self.controller.target_bitrate

    @property
    def estimate(self) -> int:
        return self.controller.estimate

    @property
    def pacing_bitrate(self) -> int:
        return self.controller.pacing_bitrate

    def state(self) -> CongestionState:
        return self.controller.state()


def controller_from_header(line: str) -> CongestionController:
    """A fresh controller built as the recorded one was (from the `init` line)."""
    start, low, high, factor = json.loads(line)["init"]
    return CongestionController(start, low, high, factor)


def replay(lines: Iterable[str], controller: CongestionController) -> list[tuple[float, int]]:
    """Feed recorded events to `controller`; (t, target) after each feedback and process.
    Blank lines and unknown events (the `init` line) are skipped."""
    targets: list[tuple[float, int]] = []
    for line in lines:
        if not line.strip():
            continue
        event = json.loads(line)
        if "sent" in event:
            sequence, size, send_time, cluster = event["sent"]
            controller.on_packet_sent(SentPacket(sequence, size, send_time, cluster))
        elif "feedback" in event:
            now = event["t"]
            controller.on_feedback(now, [PacketFeedback(s, a) for s, a in event["feedback"]])
            targets.append((now, controller.target_bitrate))
        elif "process" in event:
            controller.process(event["t"])
            targets.append((event["t"], controller.target_bitrate))
        elif "remb" in event:
            controller.on_remb(event["t"], event["remb"])
        elif "bitrates" in event:
            controller.set_bitrates(*event["bitrates"])
        elif "tolerance" in event:
            controller.set_loss_tolerance(event["tolerance"])
    return targets


def open_recording(path: str | os.PathLike[str], mode: str = "r") -> IO[str]:
    """A recording's text file, gzip'd when the name ends with .gz; `mode` "r", "w" or "a"."""
    if os.fspath(path).endswith(".gz"):
        return cast(IO[str], gzip.open(path, mode + "t", encoding="utf-8"))
    return open(path, mode, encoding="utf-8")
