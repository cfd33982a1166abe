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
class Matched:
    """What one feedback message says about packets still in the history."""

    received: list[PacketResult] = field(default_factory=list)  # in feedback order
    lost: int = 0  # newly reported lost, less those reported lost before and received now
    reported: int = 0  # packets reported for the first time (received or lost)


class SendHistory:
    """The packets sent in the last WINDOW_S, MAX_PACKETS at most.

    Each packet is kept as an exact tuple of numbers (size, send time, probe cluster), which
    the garbage collector stops tracking, and its report status in a dict of ints, which it
    never tracks: a 4K60 stream under transport-cc keeps its 10,000 packets, and as objects
    (a `SentPacket` and an entry each) they were 20,000 more for every full collection to walk,
    the pause that stops every stream of the process."""

    def __init__(self) -> None:
        self._sent: dict[int, tuple[int, float, int | None]] = {}
        self._reported: dict[int, int] = {}  # sequence → _LOST or _RECEIVED
        self._order: deque[int] = deque()  # sequence numbers in the order they were sent

    def __len__(self) -> int:
        return len(self._sent)

    def add(self, packet: SentPacket) -> bool:
        """Remember a sent packet; False for one that cannot be (a repeated sequence number, a
        time that is not finite, a negative size)."""
        sent, order = self._sent, self._order
        if (
            packet.sequence in sent
            or not is_finite(packet.send_time, packet.size)
            or packet.size < 0
        ):
            return False
        sent[packet.sequence] = (packet.size, packet.send_time, packet.probe_cluster)
        order.append(packet.sequence)
        horizon = packet.send_time - WINDOW_S
        while order and (len(order) > MAX_PACKETS or sent[order[0]][1] < horizon):
            old = order.popleft()
            del sent[old]
            self._reported.pop(old, None)
        return True

    def clear(self) -> None:
        """Forget every packet (none will be reported: the path went to REMB, or it ended)."""
        self._sent.clear()
        self._reported.clear()
        self._order.clear()

    def match(self, feedback: Iterable[PacketFeedback]) -> Matched:
        """Match feedback to sent packets. A packet counts once: a repeated report is ignored,
        except a packet first reported lost and then received (a late arrival), which counts
        as received and takes back its loss."""
        matched = Matched()
        sent, reported = self._sent, self._reported
        for item in feedback:
            sequence = item.sequence
            record = sent.get(sequence)
            status = reported.get(sequence, _UNREPORTED)
            if record is None or status == _RECEIVED:
                continue
            if item.arrival is None:
                if status == _UNREPORTED:
                    reported[sequence] = _LOST
                    matched.lost += 1
                    matched.reported += 1
                continue
            if not is_finite(item.arrival):
                continue
            if status == _LOST:
                matched.lost -= 1
            else:
                matched.reported += 1
            reported[sequence] = _RECEIVED
            size, send_time, cluster = record
            packet = SentPacket(sequence, size, send_time, cluster)
            matched.received.append(PacketResult(packet, item.arrival))
        return matched
