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


# One frame's packets as sent, numbered from `first` with the marker on the last:
# (first, payloads, payload_type, timestamp, ssrc, abs_send_time, mid, size), `size` being the
# history's when the frame was kept. An exact tuple of atomic values, which the garbage
# collector stops tracking on its first pass: as a class instance with its `HeaderExtensions`
# and payload list, the ~220 frames each 4K60 stream keeps were ~40 % of the objects that every
# full collection of a worker walked (its pause stops every stream).
SentFrame = tuple[int, tuple[bytes, ...], int, int, int, int | None, str | None, int]


def sent_frame(
    first: int,
    payloads: Sequence[bytes],
    payload_type: int,
    timestamp: int,
    ssrc: int,
    extensions: HeaderExtensions,
    size: int,
) -> SentFrame:
    """The record of a frame whose packets carry `extensions` (abs-send-time and mid: all that
    the frame sender writes on a frame; the timing records are not resent)."""
    return (first, tuple(payloads), payload_type, timestamp, ssrc, extensions.abs_send_time,
            extensions.mid, size)  # fmt: skip


def frame_packet(frame: SentFrame, key: int) -> HistoryPacket:
    """The packet the history slot `key` holds: `frame`'s last one on that slot."""
    first, payloads, payload_type, timestamp, ssrc, abs_send_time, mid, size = frame
    count = len(payloads)
    index = (key - first) % size
    index += (count - 1 - index) // size * size  # a frame longer than the history
    return HistoryPacket(
        payload_type, int(index == count - 1), (first + index) & 0xFFFF, timestamp, ssrc,
        payloads[index], HeaderExtensions(abs_send_time=abs_send_time, mid=mid),
    )  # fmt: skip


class FrameHistory(dict[int, Any]):
    """aiortc's history dict, keyed as aiortc keys it, holding `SentFrame`s."""

    def add(self, frame: SentFrame) -> None:
        count, size = len(frame[1]), frame[-1]
        start = frame[0] % size
        if count >= size:
            self.update(dict.fromkeys(range(size), frame))
            return
        for key in range(start, min(start + count, size)):
            self[key] = frame
        for key in range(start + count - size):  # over the end of the slots
            self[key] = frame

    def get(self, key: int, default: Any = None) -> Any:
        frame = dict.get(self, key)
        return default if frame is None else frame_packet(frame, key)

    def __getitem__(self, key: int) -> HistoryPacket:
        return frame_packet(dict.__getitem__(self, key), key)
