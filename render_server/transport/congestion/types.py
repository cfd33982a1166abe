"""The values that cross the congestion controller's boundary.

Times are seconds: send times and `now` on the sender's monotonic clock, arrival times on the
receiver's clock (an arbitrary origin: only differences between arrivals are read). Rates are
bits/s, sizes bytes on the wire.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


def is_finite(*values: object) -> bool:
    """Whether every value is a finite number (odd input is ignored, never raised on)."""
    isfinite = math.isfinite
    try:
        for value in values:  # a loop, not all(genexpr): called for every packet sent
            if not isfinite(value):  # type: ignore[arg-type]
                return False
    except (TypeError, OverflowError):
        return False
    return True


class BandwidthUsage(StrEnum):
    """The delay detector's hypothesis about the bottleneck queue."""

    NORMAL = "normal"
    OVERUSING = "overusing"  # the queue grows: we send above the capacity
    UNDERUSING = "underusing"  # the queue drains


class SentPacket(NamedTuple):
    """A packet as sent. The per-packet records (this, `PacketFeedback`, `PacketResult`) are
    named tuples: each stream under transport-cc makes thousands a second, and a named tuple
    is built in one call (205 ns here) where a frozen dataclass sets each field through
    `object.__setattr__` (470 ns)."""

    sequence: int  # transport-wide sequence number, unwrapped (grows without wrap)
    size: int  # bytes on the wire (the RTP packet, header included)
    send_time: float  # seconds, sender's monotonic clock
    probe_cluster: int | None = None  # id of the probe cluster it was sent in


class PacketFeedback(NamedTuple):
    sequence: int  # unwrapped, as in SentPacket
    arrival: float | None  # seconds on the receiver's clock (arbitrary origin); None: lost


@dataclass(frozen=True, slots=True)
class ProbeCluster:
    id: int
    bitrate: int  # bits/s the pacer sends the cluster at
    min_packets: int  # libwebrtc: 5
    min_bytes: int  # bitrate × 15 ms (probe duration)


@dataclass(frozen=True)
class CongestionState:
    """A snapshot for stats pages, logs and metrics."""

    target: int  # bits/s: what the encoder should aim at
    estimate: int  # bits/s: what the path carries (the target, unless a queue drains)
    pacing: int  # bits/s
    delay_based: int
    loss_based: int
    remb: int | None
    acknowledged: int | None  # measured throughput
    usage: str  # "normal" | "overusing" | "underusing"
    loss: float  # fraction lost in the last window
    rtt: float | None  # seconds
    probing: bool
    path_queue: float = 0.0  # seconds of queueing on the path at the latest feedback


class PacketResult(NamedTuple):
    """A sent packet matched with its first useful feedback (what the estimators read)."""

    sent: SentPacket
    arrival: float  # receiver's clock
