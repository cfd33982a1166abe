"""The retransmission history filled a frame at a time: aiortc's `RtpPacket`s built only for
the packets a NACK or a probe's padding asks for.

aiortc keeps every sent packet as an `RtpPacket` in a dict keyed by its sequence number modulo
the history's size (`RTCRtpSender.__rtp_history`), and nearly all of them are never read:
building one object per packet was a tenth of the send path's CPU at 4K60. Here each slot of a
frame's packets holds the frame's number (one slice of a flat array), and `get` (all that
aiortc's `_retransmit`, `count_retransmits` and the probes' padding call) builds the packet from
the frame's record: the same header fields, payload and extensions as before.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Final

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
_EMPTY: Final = -1  # a slot no frame holds (frame numbers are ≥ 0)


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


class FrameHistory:
    """aiortc's retransmission history as aiortc reads it (`get(key)`, `[key]`: the packet
    of sequence number `key` modulo the size; `clear()`), filled a frame at a time.

    The slots hold frame numbers in a flat array, and a dict holds the records of the frames
    that still own a slot (a few hundred), so a full garbage collection has next to nothing to
    walk: as a dict of slots (8,192 at 4K60), each collection visited every key and record,
    the pause that stops every stream of the process. A frame is forgotten once its last
    packet's slot is taken: packets take the slots in order, so by then all of its are."""

    def __init__(self) -> None:
        self._size = 0
        self._slots = array("q")
        self._frames: dict[int, SentFrame] = {}  # frame number → record, oldest first
        self._next = 0

    def add(self, frame: SentFrame) -> None:
        size = frame[-1]
        if size != self._size:  # the process's history grew: keep what is kept, keyed anew
            kept = [record[:-1] + (size,) for record in self._frames.values()]
            self._size, self._slots = size, array("q", [_EMPTY]) * size
            self._frames.clear()
            for old in kept:
                self.add(old)  # the same record, the new size
        number = self._next
        self._next += 1
        self._frames[number] = frame
        start, count = frame[0] % size, min(len(frame[1]), size)
        head = min(count, size - start)
        self._slots[start : start + head] = array("q", [number]) * head
        if count > head:  # over the end of the slots
            self._slots[: count - head] = array("q", [number]) * (count - head)
        frames = self._frames
        while not self._owns_last_slot(oldest := next(iter(frames))):
            del frames[oldest]

    def _owns_last_slot(self, number: int) -> bool:
        first, payloads = self._frames[number][:2]
        return self._slots[(first + len(payloads) - 1) % self._size] == number

    def _frame(self, key: int) -> SentFrame | None:
        if not 0 <= key < self._size:
            return None
        return self._frames.get(self._slots[key])

    def get(self, key: int, default: Any = None) -> Any:
        frame = self._frame(key)
        return default if frame is None else frame_packet(frame, key)

    def __getitem__(self, key: int) -> HistoryPacket:
        frame = self._frame(key)
        if frame is None:
            raise KeyError(key)
        return frame_packet(frame, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self._frame(key) is not None

    def __iter__(self) -> Iterator[int]:
        return (key for key in range(self._size) if self._frame(key) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def clear(self) -> None:
        self._slots = array("q", [_EMPTY]) * self._size
        self._frames.clear()
