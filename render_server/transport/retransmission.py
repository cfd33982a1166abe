"""NACK repair from a history that spans time, not 128 packets, and counts of what it repaired.

aiortc keeps a sender's last `RTP_HISTORY_SIZE` (128) packets for retransmission: 30 ms of a
4K stream at 25 Mbit/s (about 2,200 packets a second), less than one round trip on most
paths, so a NACK for a 4K keyframe's early packets finds nothing. `size_history` sets the
history (a dict keyed by sequence number modulo the size, `RTCRtpSender.__rtp_history`) to
cover HISTORY_S at the highest bit rate this process streams, rounded up to a power of two
(so that it divides 65,536 and the 16-bit sequence numbers wrap cleanly). `count_retransmits`
wraps one sender's `_retransmit` to count the packets a NACK asked for that it resent, and
those it no longer had.

Checked against aiortc 1.16: the module global `aiortc.rtcrtpsender.RTP_HISTORY_SIZE` (read at
every send and every retransmission), the private `RTCRtpSender._retransmit` and
`_RTCRtpSender__rtp_history`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from aiortc import RTCRtpSender, rtcrtpsender

HISTORY_S: Final = 1.5  # at least a few round trips of the slowest path we stream over
PACKET_BYTES: Final = 1100  # an RTP payload of ours, about (aiortc's packetizers fill 1200)
MIN_HISTORY: Final = 512
MAX_HISTORY: Final = 16384  # a quarter of the sequence space: an old packet never aliases


def history_for(max_bitrate: int, seconds: float = HISTORY_S) -> int:
    """Packets to keep for `seconds` of a stream at `max_bitrate` bits per second: a power of
    two in MIN_HISTORY..MAX_HISTORY."""
    packets = max_bitrate / 8 / PACKET_BYTES * seconds
    size = 1 << max(0, math.ceil(math.log2(max(packets, 1))))
    return max(MIN_HISTORY, min(MAX_HISTORY, size))


def size_history(max_bitrate: int) -> int:
    """Keep `history_for(max_bitrate)` packets per sender in this process, never fewer than
    already kept (workers of several sizes share the process's setting); the size in force."""
    size = max(history_for(max_bitrate), history_size())
    setattr(rtcrtpsender, "RTP_HISTORY_SIZE", size)  # noqa: B010 (a private module global)
    return size


def history_size() -> int:
    """Packets each sender of this process keeps for retransmission."""
    return int(getattr(rtcrtpsender, "RTP_HISTORY_SIZE"))  # noqa: B009


def count_retransmits(sender: RTCRtpSender, on_nack: Callable[[bool], None]) -> None:
    """Call `on_nack(True)` for each packet a NACK asks `sender` for that it still holds (and
    resends), `on_nack(False)` for each it no longer has."""
    retransmit = getattr(sender, "_retransmit", None)
    if not callable(retransmit) or not hasattr(sender, "_RTCRtpSender__rtp_history"):
        raise RuntimeError("this aiortc's RTCRtpSender has no retransmission to count")

    async def counted(sequence_number: int) -> None:
        # read at each NACK: the frame sender puts its own history in place of aiortc's
        history: dict[int, Any] = sender._RTCRtpSender__rtp_history
        packet = history.get(sequence_number % history_size())
        on_nack(packet is not None and packet.sequence_number == sequence_number)
        await retransmit(sequence_number)

    sender._retransmit = counted  # type: ignore[method-assign]
