"""The delay-based estimate (libwebrtc's DelayBasedBwe): inter-arrival groups feed the
trendline detector, whose hypothesis drives the AIMD rate control; a probe's result, unless
the detector sees overuse, replaces the estimate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .aimd import BACKOFF, AimdRateControl
from .inter_arrival import InterArrival
from .trendline import TrendlineEstimator
from .types import BandwidthUsage, PacketResult

STREAM_TIMEOUT_S: Final = 2.0  # kStreamTimeOut: after a gap in feedback, start the filters over


@dataclass(frozen=True, slots=True)
class DelayResult:
    updated: bool
    probe: bool = False  # the estimate is a probe's result
    recovered_from_overuse: bool = False  # underuse turned normal: the queue drained


class DelayBasedBwe:
    def __init__(self, start: float, min_bitrate: float, max_bitrate: float) -> None:
        self.rate_control = AimdRateControl(start, min_bitrate, max_bitrate)
        self._inter_arrival = InterArrival()
        self._detector = TrendlineEstimator()
        self._last_seen: float | None = None

    @property
    def estimate(self) -> float:
        return self.rate_control.estimate

    @property
    def usage(self) -> BandwidthUsage:
        return self._detector.state

    def set_rtt(self, rtt: float) -> None:
        self.rate_control.rtt = rtt

    def set_bounds(self, min_bitrate: float, max_bitrate: float) -> None:
        self.rate_control.set_bounds(min_bitrate, max_bitrate)

    def on_feedback(
        self,
        received: Sequence[PacketResult],
        acknowledged: float | None,
        probe: float | None,
        now: float,
    ) -> DelayResult:
        """`received` in arrival order; `acknowledged` the throughput, `probe` a probe result
        from this feedback."""
        if not received:
            return DelayResult(False)  # all lost, or all too late for the history
        if self._last_seen is None or now - self._last_seen > STREAM_TIMEOUT_S:
            self._inter_arrival = InterArrival()
            self._detector = TrendlineEstimator()
        self._last_seen = now
        recovered = False
        previous = self._detector.state
        for result in received:
            deltas = self._inter_arrival.compute(
                result.sent.send_time, result.arrival, now, result.sent.size
            )
            if deltas is not None:
                self._detector.update(deltas.arrival, deltas.send, result.arrival)
            state = self._detector.state
            if previous is BandwidthUsage.UNDERUSING and state is BandwidthUsage.NORMAL:
                recovered = True
            previous = state
        return self._update(acknowledged, probe, recovered, now)

    def _update(
        self, acknowledged: float | None, probe: float | None, recovered: bool, now: float
    ) -> DelayResult:
        control = self.rate_control
        if self._detector.state is BandwidthUsage.OVERUSING:
            if acknowledged is not None:
                if control.time_to_reduce_further(now, acknowledged):
                    control.update(BandwidthUsage.OVERUSING, acknowledged, now)
                    return DelayResult(True)
            elif control.initial_time_to_reduce_further(now):
                control.halve(now)  # overuse before any throughput measured
                return DelayResult(True)
            return DelayResult(False)
        if probe is not None:
            if acknowledged is not None:
                # a probe may lower the estimate, but not far below the throughput (libwebrtc's
                # limit_probes_lower_than_throughput_estimate)
                probe = max(probe, min(control.estimate, BACKOFF * acknowledged))
            control.set_estimate(probe, now)
            return DelayResult(True, probe=True)
        control.update(self._detector.state, acknowledged, now)
        return DelayResult(True, recovered_from_overuse=recovered)
