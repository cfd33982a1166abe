"""The retransmission history filled a frame at a time: aiortc's `RtpPacket`s built only for
the packets a NACK or a probe's padding asks for.

aiortc keeps every sent packet as an `RtpPacket` in a dict keyed by its sequence number modulo
the history's size (`RTCRtpSender.__rtp_history`), and nearly all of them are never read:
building one object per packet was a tenth of the send path's CPU at 4K60. Here each slot of a
frame's packets points at one record of the frame, set in one short loop, and `get`
(all that aiortc's `_retransmit`, `count_retransmits` and the probes' padding call) builds the
packet from the record: the same header fields, payload and extensions as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiortc.rtp import HeaderExtensions, RtpPacket


class HistoryPacket(RtpPacket):
    """A sent packet as the retransmission history gives it: aiortc's `RtpPacket` (its
    `_retransmit` wraps and serializes it), built without the `HeaderExtensions` that
    `RtpPacket.__init__` makes for every packet only to be replaced by the frame's."""

    def __init__(
        self,
        payload_type: int,
        marker: int,
        sequence_number: int,
        timestamp: int,
        ssrc: int,
        payload: bytes,
        extensions: HeaderExtensions,
    ) -> None:
        self.version = 2
        self.marker = marker
        self.payload_type = payload_type
        self.sequence_number = sequence_number
        self.timestamp = timestamp
        self.ssrc = ssrc
        self.csrc: list[int] = []
        self.extensions = extensions
        self.payload = payload
        self.padding_size = 0


@dataclass(slots=True)
class SentFrame:
    """One frame's packets as sent: numbered from `first`, the marker on the last."""

    first: int
    payloads: Sequence[bytes]
    payload_type: int
    timestamp: int
    ssrc: int
    extensions: HeaderExtensions
    size: int  # the history's size when the frame was kept

    def packet(self, key: int) -> HistoryPacket:
        """The packet the history slot `key` holds: the frame's last one on that slot."""
        count, size = len(self.payloads), self.size
        index = (key - self.first) % size
        index += (count - 1 - index) // size * size  # a frame longer than the history
        return HistoryPacket(
            self.payload_type, int(index == count - 1), (self.first + index) & 0xFFFF,
            self.timestamp, self.ssrc, self.payloads[index], self.extensions,
        )  # fmt: skip


class FrameHistory(dict[int, Any]):
    """aiortc's history dict, keyed as aiortc keys it, holding `SentFrame`s."""

    def add(self, frame: SentFrame) -> None:
        count, size = len(frame.payloads), frame.size
        start = frame.first % size
        if count >= size:
            self.update(dict.fromkeys(range(size), frame))
            return
        for key in range(start, min(start + count, size)):
            self[key] = frame
        for key in range(start + count - size):  # over the end of the slots
            self[key] = frame

    def get(self, key: int, default: Any = None) -> Any:
        frame = dict.get(self, key)
        return default if frame is None else frame.packet(key)

    def __getitem__(self, key: int) -> HistoryPacket:
        frame: SentFrame = dict.__getitem__(self, key)
        return frame.packet(key)
