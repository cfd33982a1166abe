"""The packets sent lately, which transport-cc feedback is matched against.

Feedback names packets by sequence number only; their send time, size and probe cluster are
looked up here. The history is bounded both in time and in count (it never grows), so a peer
that never sends feedback costs nothing: feedback about a packet that has left it (or was
never sent) is ignored, as libwebrtc's TransportFeedbackAdapter ignores packets missing from
its history.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from .types import PacketFeedback, PacketResult, SentPacket, is_finite

WINDOW_S: Final = 5.0  # feedback later than this is of no use to a delay estimate
MAX_PACKETS: Final = 10_000  # 5 s at 19 Mbit/s of 1200-byte packets; the bound above that

_UNREPORTED: Final = 0
_LOST: Final = 1
_RECEIVED: Final = 2
_EMPTY: Final = -1  # a slot that holds no packet (sequence numbers are ≥ 0)
_NO_CLUSTER: Final = -1  # probe cluster ids are ≥ 0


@dataclass(slots=True)
class Matched:
    """What one feedback message says about packets still in the history."""

    received: list[PacketResult] = field(default_factory=list)  # in feedback order
    lost: int = 0  # newly reported lost, less those reported lost before and received now
    reported: int = 0  # packets reported for the first time (received or lost)


class SendHistory:
    """The packets sent in the last WINDOW_S, of the last MAX_PACKETS sequence numbers.

    Kept in flat arrays, a ring indexed by sequence number, so that the garbage collector has
    nothing to walk: a 4K60 stream under transport-cc keeps its 10,000 packets, and as objects
    (then as tuples in a dict) each full collection visited every one of them, the pause that
    stops every stream of the process (31-41 ms of CPU at 6 × 4K60)."""

    def __init__(self) -> None:
        self._sequences = array("q", [_EMPTY]) * MAX_PACKETS
        self._sizes = array("q", bytes(8 * MAX_PACKETS))
        self._times = array("d", bytes(8 * MAX_PACKETS))
        self._clusters = array("q", bytes(8 * MAX_PACKETS))
        self._status = array("b", bytes(MAX_PACKETS))
        self._newest = _EMPTY  # the highest sequence number kept
        self._latest = -math.inf  # the latest send time kept

    def __len__(self) -> int:
        return sum(1 for s in self._sequences if s != _EMPTY and self._slot(s) is not None)

    def _slot(self, sequence: int) -> int | None:
        """Where `sequence` is kept, None where it is not (never sent, or left the window)."""
        slot = sequence % MAX_PACKETS
        if (
            self._sequences[slot] != sequence
            or sequence <= self._newest - MAX_PACKETS
            or self._times[slot] < self._latest - WINDOW_S
        ):
            return None
        return slot

    def add(self, packet: SentPacket) -> bool:
        """Remember a sent packet; False for one that cannot be (a repeated sequence number, one
        older than the last MAX_PACKETS, a time that is not finite, a negative size)."""
        sequence, size, send_time, cluster = packet
        if (
            sequence < 0
            or sequence <= self._newest - MAX_PACKETS
            or self._slot(sequence) is not None
            or not is_finite(send_time, size)
            or size < 0
        ):
            return False
        slot = sequence % MAX_PACKETS
        self._sequences[slot] = sequence
        self._sizes[slot] = size
        self._times[slot] = send_time
        self._clusters[slot] = _NO_CLUSTER if cluster is None else cluster
        self._status[slot] = _UNREPORTED
        if sequence > self._newest:
            self._newest = sequence
        if send_time > self._latest:
            self._latest = send_time
        return True

    def clear(self) -> None:
        """Forget every packet (none will be reported: the path went to REMB, or it ended)."""
        self._sequences[:] = array("q", [_EMPTY]) * MAX_PACKETS
        self._newest = _EMPTY
        self._latest = -math.inf

    def match(self, feedback: Iterable[PacketFeedback]) -> Matched:
        """Match feedback to sent packets. A packet counts once: a repeated report is ignored,
        except a packet first reported lost and then received (a late arrival), which counts
        as received and takes back its loss."""
        matched = Matched()
        received = matched.received
        sequences, times, status = self._sequences, self._times, self._status
        sizes, clusters = self._sizes, self._clusters
        oldest, earliest = self._newest - MAX_PACKETS, self._latest - WINDOW_S
        lost = reported = 0
        for sequence, arrival in feedback:  # `_slot`, inlined: this runs for every packet
            slot = sequence % MAX_PACKETS
            if (
                sequences[slot] != sequence
                or sequence <= oldest
                or times[slot] < earliest
                or status[slot] == _RECEIVED
            ):
                continue
            if arrival is None:
                if status[slot] == _UNREPORTED:
                    status[slot] = _LOST
                    lost += 1
                    reported += 1
                continue
            if not is_finite(arrival):
                continue
            if status[slot] == _LOST:
                lost -= 1
            else:
                reported += 1
            status[slot] = _RECEIVED
            cluster = clusters[slot]
            packet = SentPacket(
                sequence, sizes[slot], times[slot], None if cluster == _NO_CLUSTER else cluster
            )
            received.append(PacketResult(packet, arrival))
        matched.lost, matched.reported = lost, reported
        return matched
