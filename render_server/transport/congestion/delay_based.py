"""The delay-based estimate (libwebrtc's DelayBasedBwe): inter-arrival groups feed the
trendline detector, whose hypothesis drives the AIMD rate control; a probe's result, unless
the detector sees overuse, replaces the estimate.

One departure: the queue standing on the path (`queue_delay`) counts as well as its trend.
The trendline sees a queue only while it grows, and reacts after it has grown a while: GoogCC's
additive climb after a capacity drop, or a probe that a bursty shaper let through faster than
its rate, fills a 2 Mbit/s bottleneck past +50 ms of glass-to-glass before the slope trips.
A queue over `QUEUE_HOLD_S` holds the estimate (as underuse does: the link is full already);
one over `QUEUE_OVERUSE_S` is overuse. And a probe's raise stands on trial for `PROBE_TRIAL_S`:
a shaper lets its bucket's worth of a probe through at line speed (a 2 Mbit/s link read as
2.3), so a queue over `QUEUE_HOLD_S` in that time undoes the raise, before it grows to overuse.
A probe that filled the bottleneck measured the link: its result (95 % of it) is a ceiling the
estimate does not climb past for `CEILING_S` (AIMD's climb would otherwise fill the link to
98 % where the encoder undershot for a while, and the next burst or probe queues 40 ms), and
the most another saturated probe may raise it to: a short probe on an idle shaper rides its
bucket (a 2 Mbit/s link measured at 1.94 read 3.09 a few seconds later, on 6 packets). A probe
that got through unsaturated lifts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .aimd import BACKOFF, AimdRateControl
from .inter_arrival import InterArrival
from .probing import ProbeResult
from .queue_delay import ALLOWANCE_S
from .trendline import TrendlineEstimator
from .types import BandwidthUsage, PacketResult

STREAM_TIMEOUT_S: Final = 2.0  # kStreamTimeOut: after a gap in feedback, start the filters over
QUEUE_HOLD_S: Final = ALLOWANCE_S  # a standing queue this long: the estimate holds
QUEUE_OVERUSE_S: Final = 2 * ALLOWANCE_S  # ...this long: overuse, whatever the trend
PROBE_TRIAL_S: Final = 1.0  # a queue this soon after a probe raised the estimate undoes it
CEILING_S: Final = 5.0  # a saturated probe's result caps the climb this long


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
        self._trial: tuple[float, float] | None = None  # (until, the estimate before a probe)

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
        probe: ProbeResult | None,
        now: float,
        queue: float = 0.0,
    ) -> DelayResult:
        """`received` in arrival order; `acknowledged` the throughput, `probe` a probe result
        from this feedback, `queue` the seconds of queueing standing on the path."""
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
        return self._update(acknowledged, probe, recovered, now, queue)

    def _update(
        self,
        acknowledged: float | None,
        probe: ProbeResult | None,
        recovered: bool,
        now: float,
        queue: float,
    ) -> DelayResult:
        control = self.rate_control
        usage = self._detector.state
        if self._trial is not None:
            until, before = self._trial
            if now > until:
                self._trial = None  # the raise stood its trial
            elif queue > QUEUE_HOLD_S:  # the probe read a burst, not the link
                self._trial = None
                control.set_estimate(min(before, control.estimate), now)
                return DelayResult(True)
        if usage is BandwidthUsage.OVERUSING or queue > QUEUE_OVERUSE_S:
            if acknowledged is not None:
                if control.time_to_reduce_further(now, acknowledged):
                    control.update(BandwidthUsage.OVERUSING, acknowledged, now)
                    return DelayResult(True)
            elif control.initial_time_to_reduce_further(now):
                control.halve(now)  # overuse before any throughput measured
                return DelayResult(True)
            return DelayResult(False)
        if probe is not None:
            bitrate = probe.bitrate
            if probe.saturated:  # the link measured full lately: not more, nearer a bucket
                bitrate = min(bitrate, control.ceiling(now) or bitrate)
            if acknowledged is not None:
                # a probe may lower the estimate, but not far below the throughput (libwebrtc's
                # limit_probes_lower_than_throughput_estimate)
                bitrate = max(bitrate, min(control.estimate, BACKOFF * acknowledged))
            before = control.estimate
            control.set_estimate(bitrate, now)
            control.set_ceiling(control.estimate if probe.saturated else None, now + CEILING_S)
            if control.estimate > before:
                self._trial = (now + PROBE_TRIAL_S, before)
            return DelayResult(True, probe=True)
        if usage is BandwidthUsage.NORMAL and queue > QUEUE_HOLD_S:
            usage = BandwidthUsage.UNDERUSING  # AIMD's hold
        control.update(usage, acknowledged, now)
        return DelayResult(True, recovered_from_overuse=recovered)
