"""16-bit sequence numbers (RTP's, transport-wide ones) ordered and unwrapped as libwebrtc does:
`is_newer` (`IsNewerSequenceNumber`) and `SequenceUnwrapper` (`SeqNumUnwrapper<uint16_t>`). Pure.
"""

from __future__ import annotations

from typing import Final

# IsNewerSequenceNumber's breakpoint
HALF_SEQ: Final = 0x8000


def is_newer(value: int, previous: int) -> bool:
    """libwebrtc's `IsNewerSequenceNumber` for 16-bit numbers."""
    diff = (value - previous) & 0xFFFF
    if diff == HALF_SEQ:
        return value > previous
    return diff != 0 and diff < HALF_SEQ


class SequenceUnwrapper:
    """16-bit sequence numbers to a monotonically growing int, across wraps and mild
    reordering: libwebrtc's `SeqNumUnwrapper<uint16_t>` (the first number unwraps to itself;
    each next one to the nearest value with its low 16 bits, a tie going forward when the
    16-bit number is larger)."""

    __slots__ = ("_last", "_unwrapped")

    def __init__(self) -> None:
        self._last: int | None = None
        self._unwrapped = 0

    def unwrap(self, seq: int) -> int:
        self._unwrapped = self.peek(seq)
        self._last = seq
        return self._unwrapped

    def peek(self, seq: int) -> int:
        """What `unwrap(seq)` would return, without remembering `seq`."""
        if not 0 <= seq <= 0xFFFF:
            raise ValueError(f"sequence number {seq} is not 16-bit")
        if self._last is None:
            return seq
        forward = (seq - self._last) & 0xFFFF
        ahead = seq > self._last if forward == HALF_SEQ else forward < HALF_SEQ
        return self._unwrapped + (forward if ahead else forward - 0x10000)
