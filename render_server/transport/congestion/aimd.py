"""Additive-increase, multiplicative-decrease rate control (libwebrtc's AimdRateControl).

The delay detector's hypothesis drives a three-state machine: overuse cuts the estimate to
`BACKOFF` × the measured throughput (just under what the bottleneck delivered, to drain the
queue we built); underuse holds (the queue drains by itself); normal increases. How fast it
increases depends on whether we know where the link's capacity is: far from any overuse seen
before, multiplicatively (8 %/s, to find a new capacity quickly); near the throughput at which
we last overused, additively (about a packet per response time, to stay there). The estimate
may not run away from what the receiver acknowledges: at most 1.5 × throughput + 10 kbit/s,
unless a probe measured more; nor past a ceiling a probe that filled the link set, for a while.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Final

from .types import BandwidthUsage

BACKOFF: Final = 0.85  # kDefaultBackoffFactor
DEFAULT_RTT_S: Final = 0.2  # kDefaultRtt
MULTIPLICATIVE_INCREASE: Final = 1.08  # per second, far from the link capacity
MIN_MULTIPLICATIVE_STEP: Final = 1000.0  # bits/s
MIN_ADDITIVE_RATE: Final = 4000.0  # kMinIncreaseRateBpsPerSecond
DETECTOR_DELAY_S: Final = 0.1  # the over-use detector's own delay, in the response time
FRAME_INTERVAL_S: Final = 1 / 30
PACKET_BYTES: Final = 1200  # the additive step assumes such packets
INCREASE_LIMIT_FACTOR: Final = 1.5  # the estimate stays under 1.5 × throughput + 10 kbit/s
INCREASE_LIMIT_OFFSET: Final = 10_000.0
REDUCTION_INTERVAL_S: Final = (0.01, 0.2)  # the rtt, clamped: one decrease per this


class _State(Enum):
    HOLD = "hold"
    INCREASE = "increase"
    DECREASE = "decrease"


class LinkCapacityEstimator:
    """The throughput at which we overused, averaged, with its normalized variance: the rate
    controller increases additively within 3 deviations of it (libwebrtc's
    LinkCapacityEstimator, in kbit/s as its constants are)."""

    ALPHA: Final = 0.05
    DEVIATION_RANGE: Final = (0.4, 2.5)  # ~14 and ~35 kbit/s at 500 kbit/s

    def __init__(self) -> None:
        self._estimate_kbps: float | None = None
        self._deviation_kbps = 0.4

    @property
    def estimate(self) -> float | None:
        return None if self._estimate_kbps is None else self._estimate_kbps * 1e3

    def reset(self) -> None:
        self._estimate_kbps = None

    def _std_kbps(self, estimate_kbps: float) -> float:
        return math.sqrt(self._deviation_kbps * max(estimate_kbps, 0.0))

    def upper_bound(self) -> float:
        if self._estimate_kbps is None:
            return math.inf
        return (self._estimate_kbps + 3 * self._std_kbps(self._estimate_kbps)) * 1e3

    def lower_bound(self) -> float:
        if self._estimate_kbps is None:
            return 0.0
        return (self._estimate_kbps - 3 * self._std_kbps(self._estimate_kbps)) * 1e3

    def on_overuse(self, throughput: float) -> None:
        sample = throughput / 1e3
        if self._estimate_kbps is None:
            self._estimate_kbps = sample
        else:
            self._estimate_kbps = (1 - self.ALPHA) * self._estimate_kbps + self.ALPHA * sample
        norm = max(self._estimate_kbps, 1.0)
        error = self._estimate_kbps - sample
        deviation = (1 - self.ALPHA) * self._deviation_kbps + self.ALPHA * error * error / norm
        low, high = self.DEVIATION_RANGE
        self._deviation_kbps = min(max(deviation, low), high)


class AimdRateControl:
    def __init__(self, start: float, min_bitrate: float, max_bitrate: float) -> None:
        self._min = min_bitrate
        self._max = max_bitrate
        self.estimate = self._clamp(start)
        self._throughput = self.estimate  # the latest measured, or the start rate until one
        self._state = _State.HOLD
        self._last_change: float | None = None
        self.rtt = DEFAULT_RTT_S
        self.capacity = LinkCapacityEstimator()
        self._ceiling: tuple[float, float] | None = None  # (bits/s, until when)

    def set_bounds(self, min_bitrate: float, max_bitrate: float) -> None:
        self._min, self._max = min_bitrate, max_bitrate
        self.estimate = self._clamp(self.estimate)

    def set_estimate(self, bitrate: float, now: float) -> None:
        """A probe's result replaces the estimate, whatever the throughput says."""
        self.estimate = self._clamp(bitrate)
        self._last_change = now

    def set_ceiling(self, bitrate: float | None, until: float) -> None:
        """The estimate does not increase past `bitrate` until `until` (None: no ceiling)."""
        self._ceiling = None if bitrate is None else (bitrate, until)

    def ceiling(self, now: float) -> float | None:
        if self._ceiling is not None and now >= self._ceiling[1]:
            self._ceiling = None
        return None if self._ceiling is None else self._ceiling[0]

    def _under_ceiling(self, bitrate: float, now: float) -> float:
        ceiling = self.ceiling(now)
        if ceiling is None:
            return bitrate
        return min(bitrate, max(ceiling, self.estimate))  # a cap on increase, never a cut

    def time_to_reduce_further(self, now: float, throughput: float) -> bool:
        """Decrease at most once per rtt, unless the throughput fell below half the estimate."""
        low, high = REDUCTION_INTERVAL_S
        interval = min(max(self.rtt, low), high)
        if self._last_change is None or now - self._last_change >= interval:
            return True
        return throughput < 0.5 * self.estimate

    def initial_time_to_reduce_further(self, now: float) -> bool:
        return self.time_to_reduce_further(now, self.estimate / 2 - 1)

    def halve(self, now: float) -> None:
        """Overuse before any throughput was measured: halve (libwebrtc, every 200 ms)."""
        self.set_estimate(self.estimate / 2, now)

    def update(self, usage: BandwidthUsage, throughput: float | None, now: float) -> float:
        if throughput is not None:
            self._throughput = throughput
        measured = self._throughput
        self._change_state(usage, now)
        new: float | None = None
        if self._state is _State.INCREASE:
            if measured > self.capacity.upper_bound():
                self.capacity.reset()  # far above where we overused: the link changed
            limit = INCREASE_LIMIT_FACTOR * measured + INCREASE_LIMIT_OFFSET
            if self.estimate < limit:
                elapsed = 0.0 if self._last_change is None else max(now - self._last_change, 0.0)
                if self.capacity.estimate is not None:
                    increased = self.estimate + self._additive_rate() * elapsed
                else:
                    alpha = MULTIPLICATIVE_INCREASE ** min(elapsed, 1.0)
                    increased = self.estimate + max(
                        self.estimate * (alpha - 1), MIN_MULTIPLICATIVE_STEP
                    )
                new = self._under_ceiling(min(increased, limit), now)
            self._last_change = now
        elif self._state is _State.DECREASE:
            # just under what the bottleneck delivered, to drain the queue we built
            decreased = BACKOFF * measured
            if decreased > self.estimate and self.capacity.estimate is not None:
                decreased = BACKOFF * self.capacity.estimate
            if decreased < self.estimate:  # overuse never increases
                new = decreased
            if measured < self.capacity.lower_bound():
                self.capacity.reset()  # far below: the capacity changed, start over
            self.capacity.on_overuse(measured)
            self._state = _State.HOLD  # until the queue drained
            self._last_change = now
        if new is not None:
            self.estimate = self._clamp(new)
        return self.estimate

    def _change_state(self, usage: BandwidthUsage, now: float) -> None:
        if usage is BandwidthUsage.NORMAL:
            if self._state is _State.HOLD:
                self._last_change = now
                self._state = _State.INCREASE
        elif usage is BandwidthUsage.OVERUSING:
            self._state = _State.DECREASE
        else:
            self._state = _State.HOLD

    def _additive_rate(self) -> float:
        """About one packet per response time (rtt + the detector's delay, twice), bits/s²."""
        frame_bytes = self.estimate * FRAME_INTERVAL_S / 8
        packets = max(math.ceil(frame_bytes / PACKET_BYTES), 1)
        packet_bits = frame_bytes / packets * 8
        response_time = 2 * (self.rtt + DETECTOR_DELAY_S)
        return max(MIN_ADDITIVE_RATE, packet_bits / response_time)

    def _clamp(self, bitrate: float) -> float:
        return min(max(bitrate, self._min), self._max)
