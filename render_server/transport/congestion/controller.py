"""`CongestionController`: a send-side congestion controller after libwebrtc's GoogCC.

Sans-IO: the caller reports every packet it sends and every transport-cc feedback message,
calls `process` every ~25 ms, and reads the target (for the encoder), the pacing rate (for
the pacer) and the probe clusters to send (`next_probe`). Every method takes the time; none
raises on odd input (unknown or repeated sequence numbers, jumps of the receiver's clock,
time going back: the controller's own time never does).

estimate = min(delay-based, loss-based, REMB) within [min, max], where the loss-based bound is
itself kept under the delay-based estimate (as libwebrtc's SendSideBandwidthEstimation is);
the pacer and the probes go by it. The encoder's target is the estimate, less while a queue
stands on the path (`queue_delay`: what a capacity drop left is drained within half a second
instead of the seconds GoogCC's 15 % margin takes), and the delay-based estimate reads it too
(`delay_based`: a standing queue holds the estimate, a long one is overuse).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .alr import AlrDetector
from .delay_based import DelayBasedBwe
from .history import SendHistory
from .loss import HIGH_LOSS, LossBasedBwe
from .probing import ProbeBitrateEstimator, ProbeController
from .queue_delay import QueueDelay
from .rtt import RttEstimator
from .throughput import AcknowledgedBitrate
from .types import (
    CongestionState,
    PacketFeedback,
    PacketResult,
    ProbeCluster,
    SentPacket,
    is_finite,
)


def _arrival_order(result: PacketResult) -> tuple[float, float, int]:
    return result.arrival, result.sent.send_time, result.sent.sequence


MIN_BITRATE_FLOOR: Final = 5_000  # kCongestionControllerMinBitrate
PACING_FLOOR: Final = 300_000  # a keyframe at the minimum bitrate must not take seconds


class CongestionController:
    def __init__(
        self, start_bitrate: int, min_bitrate: int, max_bitrate: int, pacing_factor: float = 2.5
    ) -> None:
        if (
            not is_finite(start_bitrate, min_bitrate, max_bitrate, pacing_factor)
            or pacing_factor <= 0
        ):
            raise ValueError("the bitrates and the pacing factor must be finite, the factor > 0")
        self._min, self._max = self._bounds(min_bitrate, max_bitrate)
        self.start_bitrate = start_bitrate
        self.pacing_factor = pacing_factor
        start = min(max(float(start_bitrate), self._min), self._max)
        self._now: float | None = None  # the latest time seen; never goes back
        self._remb: float | None = None
        self._history = SendHistory()
        self._rtt = RttEstimator()
        self._throughput = AcknowledgedBitrate()
        self._delay = DelayBasedBwe(start, self._min, self._max)
        self._loss = LossBasedBwe(start, self._min, self._max)
        self._probes = ProbeController(start, self._max)
        self._probe_estimator = ProbeBitrateEstimator()
        self._alr = AlrDetector(start)
        self._queue = QueueDelay()

    @property
    def min_bitrate(self) -> int:
        return int(self._min)

    @property
    def max_bitrate(self) -> int:
        return int(self._max)

    @property
    def estimate(self) -> int:
        """What the path carries, as far as the controller knows (bits/s)."""
        estimate = min(self._delay.estimate, self._loss.estimate)
        if self._remb is not None:
            estimate = min(estimate, self._remb)
        return int(min(max(estimate, self._min), self._max))

    @property
    def target_bitrate(self) -> int:
        """What the encoder should send: the estimate, less while a queue drains."""
        factor = 1.0 if self._now is None else self._queue.factor(self._now)
        return int(max(self.estimate * factor, self._min))

    @property
    def queue_delay(self) -> float:
        """Seconds of queueing on the path at the latest feedback."""
        return 0.0 if self._now is None else self._queue.queue(self._now)

    @property
    def pacing_bitrate(self) -> int:
        return int(max(self.estimate * self.pacing_factor, PACING_FLOOR))

    def on_packet_sent(self, packet: SentPacket) -> None:
        if not self._history.add(packet):
            return
        if packet.probe_cluster is not None:
            self._probe_estimator.on_sent(packet.probe_cluster)
        self._probes.clock(packet.send_time)
        self._alr.on_bytes_sent(packet.size, packet.send_time)

    def forget_sent(self) -> None:
        """Drop the packets sent and not yet reported: no feedback will come for them. Left
        in place they would wait for the cyclic collector with the rest of the session (a full
        collection of a few ended 4K sessions' packets stalled every stream for 25–36 ms)."""
        self._history.clear()

    def on_feedback(self, now: float, feedback: Sequence[PacketFeedback]) -> None:
        t = self._clock(now)
        if t is None:
            return
        matched = self._history.match(feedback)
        self._loss.on_feedback(matched.lost, matched.reported, t)
        received = matched.received
        received.sort(key=_arrival_order)
        if received:
            self._update_rtt(t - max(r.sent.send_time for r in received))
        self._throughput.update(received)
        self._queue.update(t, received)
        probes = self._probes
        for result in received:
            cluster_id = result.sent.probe_cluster
            if cluster_id is not None:
                cluster = probes.cluster(cluster_id)
                if cluster is not None:
                    self._probe_estimator.handle(result, cluster)
        probe = self._probe_estimator.fetch()
        queue = self._queue.queue(t)
        delay = self._delay.on_feedback(received, self._throughput.bitrate, probe, t, queue)
        if delay.updated:
            if delay.probe and self._loss.fraction_loss <= HIGH_LOSS:
                self._loss.set_send_bitrate(self._delay.estimate)  # as libwebrtc on a probe
            self._loss.set_delay_limit(self._delay.estimate)
        if delay.recovered_from_overuse:
            self._probes.request_probe(t, self._alr.start_time, self._alr.end_time)
        self._target_changed(t)

    def on_remb(self, now: float, bitrate: int) -> None:
        t = self._clock(now)
        if t is None or not is_finite(bitrate) or bitrate <= 0:
            return
        self._remb = float(bitrate)
        self._target_changed(t)

    def set_loss_tolerance(self, fraction: float) -> None:
        """Loss up to `fraction` is repaired on the way (FEC): the loss-based bound takes only
        what exceeds it as loss."""
        if is_finite(fraction):
            self._loss.tolerance = min(max(float(fraction), 0.0), 0.2)

    def set_bitrates(self, min_bitrate: int, max_bitrate: int) -> None:
        if not is_finite(min_bitrate, max_bitrate):
            return
        self._min, self._max = self._bounds(min_bitrate, max_bitrate)
        self._delay.set_bounds(self._min, self._max)
        self._loss.set_bounds(self._min, self._max)
        self._probes.set_max(self._max, self._now)
        if self._now is not None:
            self._target_changed(self._now)

    def process(self, now: float) -> None:
        t = self._clock(now)
        if t is None:
            return
        self._loss.update(t)
        # a probe can only lift the delay-based estimate: no use while loss or REMB hold the
        # target down
        estimate = min(self._delay.estimate, self._loss.estimate)
        may_probe = self._loss.fraction_loss <= HIGH_LOSS and (
            self._remb is None or self._remb > estimate
        )
        self._probes.process(t, self._alr.start_time, may_probe)
        self._target_changed(t)

    def next_probe(self, now: float) -> ProbeCluster | None:
        """The next probe cluster to send, once; ask again when it has been sent."""
        if not is_finite(now):
            return None
        return self._probes.pop(now)

    def state(self) -> CongestionState:
        acknowledged = self._throughput.bitrate
        return CongestionState(
            target=self.target_bitrate,
            estimate=self.estimate,
            pacing=self.pacing_bitrate,
            delay_based=int(self._delay.estimate),
            loss_based=int(self._loss.estimate),
            remb=None if self._remb is None else int(self._remb),
            acknowledged=None if acknowledged is None else int(acknowledged),
            usage=self._delay.usage.value,
            loss=self._loss.fraction_loss,
            rtt=self._rtt.rtt,
            probing=self._probes.probing,
            path_queue=self.queue_delay,
        )

    def _update_rtt(self, sample: float) -> None:
        self._rtt.add(sample)
        rtt = self._rtt.rtt
        if rtt is not None:
            self._delay.set_rtt(rtt)
            self._loss.rtt = rtt

    def _target_changed(self, now: float) -> None:
        estimate = self.estimate
        self._alr.set_estimate(estimate)
        self._probes.set_estimate(estimate, now)

    def _clock(self, now: float) -> float | None:
        """`now`, never before a time seen already; None for a time that is not a number."""
        if not is_finite(now):
            return None
        if self._now is not None and now < self._now:
            now = self._now
        self._now = now
        self._probes.clock(now)
        return now

    @staticmethod
    def _bounds(min_bitrate: float, max_bitrate: float) -> tuple[float, float]:
        low = max(float(min_bitrate), MIN_BITRATE_FLOOR)
        return low, max(float(max_bitrate), low)
