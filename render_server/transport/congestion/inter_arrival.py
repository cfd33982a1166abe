"""Send-time groups and the deltas between them (libwebrtc's InterArrivalDelta).

A pacer sends a frame as a burst; the packets of one burst are queued together at the
bottleneck, so their individual spacing says nothing. Packets sent within `GROUP_LENGTH_S` of
a group's first packet form one group, and the delay detector reads how the spacing between
consecutive groups changed on the way: (arrival delta - send delta) > 0 means a queue grew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

GROUP_LENGTH_S: Final = 0.005  # kTimestampGroupLengthMs
BURST_DELTA_S: Final = 0.005  # kBurstDeltaThreshold
MAX_BURST_S: Final = 0.1  # kMaxBurstDuration
ARRIVAL_OFFSET_THRESHOLD_S: Final = 3.0  # kArrivalTimeOffsetThreshold: the receiver's clock jumped
REORDERED_RESET: Final = 3  # kReorderedResetThreshold


@dataclass(frozen=True, slots=True)
class Deltas:
    send: float  # seconds between the two groups' last send times
    arrival: float  # seconds between the two groups' last arrivals
    size: int  # bytes, the later group's size less the earlier's


@dataclass(slots=True)
class _Group:
    first_send: float
    send: float  # the latest send time in the group
    first_arrival: float
    complete: float  # the latest arrival in the group
    last_system: float  # the feedback time of its latest packet
    size: int = 0


class InterArrival:
    """Feed packets in arrival order; each packet that starts a new group yields the deltas
    between the two groups before it."""

    def __init__(self, group_length: float = GROUP_LENGTH_S) -> None:
        self._group_length = group_length
        self._current: _Group | None = None
        self._previous: _Group | None = None
        self._reordered = 0

    def reset(self) -> None:
        self._current = self._previous = None
        self._reordered = 0

    def compute(
        self, send_time: float, arrival: float, system_time: float, size: int
    ) -> Deltas | None:
        """`system_time` is the sender's clock when the feedback came: a jump of the arrival
        clock that the sender's clock did not make resets the groups."""
        current = self._current
        if current is None:
            self._current = _Group(send_time, send_time, arrival, arrival, system_time, size)
            return None
        if send_time < current.first_send:
            return None  # sent before the current group: reordered, of no use
        deltas: Deltas | None = None
        if not self._belongs_to_burst(current, send_time, arrival) and (
            send_time - current.first_send > self._group_length
        ):  # a new group
            previous = self._previous
            if previous is not None:
                send_delta = current.send - previous.send
                arrival_delta = current.complete - previous.complete
                system_delta = current.last_system - previous.last_system
                if arrival_delta - system_delta >= ARRIVAL_OFFSET_THRESHOLD_S:
                    self.reset()
                    return None
                if arrival_delta < 0:
                    # the groups arrived out of order; a run of those: the arrival clock jumped back
                    self._reordered += 1
                    if self._reordered >= REORDERED_RESET:
                        self.reset()
                        return None
                else:
                    self._reordered = 0
                    deltas = Deltas(send_delta, arrival_delta, current.size - previous.size)
            self._previous = current
            self._current = _Group(send_time, send_time, arrival, arrival, system_time, size)
            return deltas
        if send_time > current.send:  # a comparison, not max(): this runs for every packet
            current.send = send_time
        current.size += size
        current.complete = arrival
        current.last_system = system_time
        return None

    @staticmethod
    def _belongs_to_burst(current: _Group, send_time: float, arrival: float) -> bool:
        """Packets that arrive closer together than they were sent were queued together: a
        burst, one group however long it took to send."""
        arrival_delta = arrival - current.complete
        send_delta = send_time - current.send
        if send_delta == 0:
            return True
        propagation_delta = arrival_delta - send_delta
        return (
            propagation_delta < 0
            and arrival_delta <= BURST_DELTA_S
            and arrival - current.first_arrival < MAX_BURST_S
        )
