"""The packets sent lately, which transport-cc feedback is matched against.

Feedback names packets by sequence number only; their send time, size and probe cluster are
looked up here. The history is bounded both in time and in count, so a peer that never sends
feedback costs nothing: feedback about a packet that has left it (or was never sent) is
ignored, as libwebrtc's TransportFeedbackAdapter ignores packets missing from its history.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from .types import PacketFeedback, PacketResult, SentPacket, is_finite

WINDOW_S: Final = 5.0  # feedback later than this is of no use to a delay estimate
MAX_PACKETS: Final = 10_000  # 5 s at 19 Mbit/s of 1200-byte packets; the bound above that

_UNREPORTED: Final = 0
_LOST: Final = 1
_RECEIVED: Final = 2


@dataclass(slots=True)
class _Entry:
    packet: SentPacket
    status: int = _UNREPORTED


@dataclass(slots=True)
class Matched:
    """What one feedback message says about packets still in the history."""

    received: list[PacketResult] = field(default_factory=list)  # in feedback order
    lost: int = 0  # newly reported lost, less those reported lost before and received now
    reported: int = 0  # packets reported for the first time (received or lost)


class SendHistory:
    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._order: deque[int] = deque()  # sequence numbers in the order they were sent

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, packet: SentPacket) -> bool:
        """Remember a sent packet; False for one that cannot be (a repeated sequence number, a
        time that is not finite, a negative size)."""
        if (
            packet.sequence in self._entries
            or not is_finite(packet.send_time, packet.size)
            or packet.size < 0
        ):
            return False
        self._entries[packet.sequence] = _Entry(packet)
        self._order.append(packet.sequence)
        horizon = packet.send_time - WINDOW_S
        while self._order and (
            len(self._order) > MAX_PACKETS
            or self._entries[self._order[0]].packet.send_time < horizon
        ):
            del self._entries[self._order.popleft()]
        return True

    def clear(self) -> None:
        """Forget every packet (none will be reported: the path went to REMB, or it ended)."""
        self._entries.clear()
        self._order.clear()

    def match(self, feedback: Iterable[PacketFeedback]) -> Matched:
        """Match feedback to sent packets. A packet counts once: a repeated report is ignored,
        except a packet first reported lost and then received (a late arrival), which counts
        as received and takes back its loss."""
        matched = Matched()
        for item in feedback:
            entry = self._entries.get(item.sequence)
            if entry is None or entry.status == _RECEIVED:
                continue
            if item.arrival is None:
                if entry.status == _UNREPORTED:
                    entry.status = _LOST
                    matched.lost += 1
                    matched.reported += 1
                continue
            if not is_finite(item.arrival):
                continue
            if entry.status == _LOST:
                matched.lost -= 1
            else:
                matched.reported += 1
            entry.status = _RECEIVED
            matched.received.append(PacketResult(entry.packet, item.arrival))
        return matched
