"""The packet status chunks of transport-wide feedback, written and read as libwebrtc's
`rtcp::TransportFeedback` does: the status symbols, `LastChunk` (libwebrtc's choice between a
run length and a status vector), `Chunks` (one packet's) and `decode_chunk`. The packet around
them, and its format, are transport_feedback.py's. Pure.
"""

from __future__ import annotations

from typing import Final

# status symbols, which are also the receive delta's size in bytes
NOT_RECEIVED: Final = 0
SMALL: Final = 1
LARGE: Final = 2
RESERVED: Final = 3

# libwebrtc's LastChunk capacities
_MAX_RUN_LENGTH: Final = 0x1FFF
_ONE_BIT_CAPACITY: Final = 14
_TWO_BIT_CAPACITY: Final = 7


class LastChunk:
    """libwebrtc's `TransportFeedback::LastChunk`: the statuses not yet written to a chunk,
    and the rules that decide whether the next one joins them."""

    __slots__ = ("all_same", "has_large", "size", "symbols")

    def __init__(self) -> None:
        self.symbols = [0] * _ONE_BIT_CAPACITY  # the first 14 statuses
        self.size = 0
        self.all_same = True
        self.has_large = False

    def copy(self) -> LastChunk:
        other = LastChunk()
        other.symbols = self.symbols.copy()
        other.size, other.all_same, other.has_large = self.size, self.all_same, self.has_large
        return other

    def clear(self) -> None:
        self.size = 0
        self.all_same = True
        self.has_large = False

    def can_add(self, symbol: int) -> bool:
        if self.size < _TWO_BIT_CAPACITY:
            return True
        if self.size < _ONE_BIT_CAPACITY and not self.has_large and symbol != LARGE:
            return True
        return self.size < _MAX_RUN_LENGTH and self.all_same and self.symbols[0] == symbol

    def add(self, symbol: int) -> None:
        if self.size < _ONE_BIT_CAPACITY:
            self.symbols[self.size] = symbol
        self.size += 1
        self.all_same = self.all_same and symbol == self.symbols[0]
        self.has_large = self.has_large or symbol == LARGE

    def add_not_received(self, count: int) -> int:
        """Add up to `count` not-received statuses while they fit; how many did."""
        if self.size == 0 or (self.all_same and self.symbols[0] == NOT_RECEIVED):
            # a run of not received (what libwebrtc's AddMissingPackets writes): in bulk
            added = min(count, _MAX_RUN_LENGTH - self.size)
            for i in range(self.size, min(self.size + added, _ONE_BIT_CAPACITY)):
                self.symbols[i] = NOT_RECEIVED
            self.size += added
            return added
        added = 0
        while added < count and self.can_add(NOT_RECEIVED):
            self.add(NOT_RECEIVED)
            added += 1
        return added

    def emit(self) -> int:
        """The chunk to write when the next status cannot join (libwebrtc's `Emit`)."""
        if self.all_same:
            chunk = self._run_length()
            self.clear()
            return chunk
        if self.size == _ONE_BIT_CAPACITY:
            chunk = self._one_bit()
            self.clear()
            return chunk
        chunk = self._two_bit(_TWO_BIT_CAPACITY)
        rest = self.symbols[_TWO_BIT_CAPACITY : self.size]
        self.clear()
        for symbol in rest:
            self.add(symbol)
        return chunk

    def encode_last(self) -> int:
        if self.all_same:
            return self._run_length()
        if self.size <= _TWO_BIT_CAPACITY:
            return self._two_bit(self.size)
        return self._one_bit()

    def _run_length(self) -> int:
        return (self.symbols[0] << 13) | self.size

    def _one_bit(self) -> int:
        chunk = 0x8000
        for i in range(self.size):
            chunk |= self.symbols[i] << (_ONE_BIT_CAPACITY - 1 - i)
        return chunk

    def _two_bit(self, size: int) -> int:
        chunk = 0xC000
        for i in range(size):
            chunk |= self.symbols[i] << (2 * (_TWO_BIT_CAPACITY - 1 - i))
        return chunk


class Chunks:
    """The status chunks of one packet, written as libwebrtc writes them."""

    __slots__ = ("count", "encoded", "last")

    def __init__(self) -> None:
        self.encoded: list[int] = []
        self.last = LastChunk()
        self.count = 0

    @property
    def size(self) -> int:
        """Bytes the chunks take."""
        return 2 * (len(self.encoded) + (self.last.size > 0))

    def add(self, symbol: int) -> None:
        if not self.last.can_add(symbol):
            self.encoded.append(self.last.emit())
        self.last.add(symbol)
        self.count += 1

    def add_not_received(self, count: int) -> None:
        self.count += count
        while count:
            count -= self.last.add_not_received(count)
            if count:
                self.encoded.append(self.last.emit())

    def words(self) -> list[int]:
        return self.encoded + ([self.last.encode_last()] if self.last.size else [])


def decode_chunk(chunk: int, left: int) -> list[int]:
    """The statuses in `chunk`, at most `left` of them (the rest of a last chunk is filler)."""
    if not chunk & 0x8000:  # run length
        return [(chunk >> 13) & 0x03] * min(chunk & _MAX_RUN_LENGTH, left)
    if not chunk & 0x4000:  # status vector, 14 one-bit symbols
        count = min(_ONE_BIT_CAPACITY, left)
        return [(chunk >> (_ONE_BIT_CAPACITY - 1 - i)) & 0x01 for i in range(count)]
    count = min(_TWO_BIT_CAPACITY, left)  # status vector, 7 two-bit symbols
    return [(chunk >> (2 * (_TWO_BIT_CAPACITY - 1 - i))) & 0x03 for i in range(count)]
