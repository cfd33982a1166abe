"""Probing: short bursts above the estimate that measure what the path can take.

The delay-based estimate can only creep up (8 %/s at best) because it learns nothing about a
rate until it sends at it. A probe cluster is a burst at a chosen bitrate, `PROBE_DURATION_S`
long; how fast its packets arrived measures the capacity at once. The controller probes at
start (3× and 6× the start bitrate), further (2× the result) while each result reaches 70 % of
what was probed, when the session's max rises, periodically in the application-limited region
(libwebrtc's ALR probing), and after a large drop of the estimate (libwebrtc's `RequestProbe`
when the delay detector recovers in that region, and, ours, a probe at 2× the estimate every
few seconds while the estimate stays far under what it was: a capacity that came back is
found within seconds, not after minutes of additive increase). While so recovering, a
further probe waits `FURTHER_WAIT_S` for the raise to hold: a shaper's bucket made a 2 Mbit/s
link read 2.8 on a 6-packet probe, and the 12 kB further probe at twice that queued 50 ms.

The estimator (libwebrtc's ProbeBitrateEstimator) turns a cluster's feedback into a rate once
80 % of its packets (of those the pacer sent, not only of the planned five) and bytes are
acknowledged: min(send rate, receive rate). A receive rate under 90 % of the send rate means
the probe filled the bottleneck: the result is 95 % of the receive rate. A shaper's token
bucket lets its burst's worth through at line speed before the queue forms, so a short probe
over-reads a narrow link (a 2 Mbit/s link with a 3 kB bucket read 3.7 Mbit/s on 5 of a
cluster's 11 packets, 2.6 on all 11): a filled bottleneck's receive rate is also measured
over the later half of the arrivals, when it spaces them at its own rate, and the lower of
the two counts (not to tell whether it filled: on a wide link the later half's few arrivals
read ±20 %). A receive rate over twice the send rate means a queue bunched the packets
together (they waited behind others and left back to back): the spacing measured the queue,
not the link, and the cluster is rejected; so is one spread over more than a second, and the
tail of a cluster older than one that already gave a result.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from .types import PacketResult, ProbeCluster

# the cluster
MIN_PROBE_PACKETS: Final = 5  # kMinProbePacketsSent
PROBE_DURATION_S: Final = 0.015  # kMinProbeDurationMs
# the estimator
MIN_RECEIVED_FRACTION: Final = 0.8  # kMinReceivedProbesPercent, kMinReceivedBytesPercent
MAX_VALID_RATIO: Final = 2.0  # kMaxValidRatio: receive / send above this is a queue's bunching
MIN_RATIO_UNSATURATED: Final = 0.9  # kMinRatioForUnsaturatedLink
TARGET_UTILIZATION: Final = 0.95  # kTargetUtilizationFraction
MAX_CLUSTER_HISTORY_S: Final = 1.0  # kMaxClusterHistoryMs
MAX_PROBE_INTERVAL_S: Final = 1.0  # kMaxProbeIntervalMs
MIN_LATER_PACKETS: Final = 2  # the later half's rate counts from this many intervals
# the controller
MAX_WAITING_S: Final = 1.0  # kMaxWaitingTimeForProbingResultMs
FIRST_EXPONENTIAL_SCALE: Final = 3.0  # p1
SECOND_EXPONENTIAL_SCALE: Final = 6.0  # p2
FURTHER_SCALE: Final = 2.0  # step_size
FURTHER_THRESHOLD: Final = 0.7  # further_probe_threshold
FURTHER_WAIT_S: Final = 0.25  # ours: while recovering, a raise holds this long before the next
BITRATE_DROP_THRESHOLD: Final = 0.66  # kBitrateDropThreshold
BITRATE_DROP_TIMEOUT_S: Final = 5.0  # kBitrateDropTimeoutMs; also the window a drop is from
PROBE_FRACTION_AFTER_DROP: Final = 0.85  # kProbeFractionAfterDrop
PROBE_UNCERTAINTY: Final = 0.05  # kProbeUncertainty
MIN_TIME_BETWEEN_DROP_PROBES_S: Final = 5.0  # kMinTimeBetweenAlrProbesMs
ALR_PROBING_INTERVAL_S: Final = 5.0  # alr_interval
ALR_PROBE_SCALE: Final = 2.0  # alr_scale
ALR_ENDED_TIMEOUT_S: Final = 3.0  # kAlrEndedTimeoutMs
RECOVERY_INTERVAL_S: Final = 2.5  # ours: the first recovery probe, this long after the drop
RECOVERY_INTERVAL_STEP_S: Final = 0.5  # ... each unsuccessful one waits this much longer
RECOVERY_MAX_INTERVAL_S: Final = 5.0  # ... up to this
RECOVERY_SCALE: Final = 2.0
RECOVERED_FRACTION: Final = 0.85  # recovery probing ends at this fraction of the pre-drop rate
KEPT_CLUSTERS: Final = 32


@dataclass(slots=True)
class _Aggregate:
    first_send: float = math.inf
    last_send: float = -math.inf
    first_receive: float = math.inf
    last_receive: float = -math.inf
    size_last_send: int = 0  # bits
    size_first_receive: int = 0
    size_total: int = 0
    packets: int = 0
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (arrival, bits)


@dataclass(frozen=True, slots=True)
class ProbeResult:
    bitrate: float
    saturated: bool  # the probe filled the bottleneck: the bitrate is the link's, less 5 %


def _later_half_rate(arrivals: list[tuple[float, int]]) -> float | None:
    """The rate the later half of the arrivals came at (bits/s); None for too few."""
    ordered = sorted(arrivals)
    middle = (len(ordered) - 1) // 2  # 5 of 11 packets; 2 of 6 (a 3 kB bucket passes 2.5)
    later = ordered[middle + 1 :]
    span = ordered[-1][0] - ordered[middle][0]
    if len(later) < MIN_LATER_PACKETS or span <= 0:
        return None
    return sum(bits for _, bits in later) / span


class ProbeBitrateEstimator:
    def __init__(self) -> None:
        self._clusters: dict[int, _Aggregate] = {}
        self._sent: dict[int, int] = {}  # packets the pacer sent, per cluster
        self._result: ProbeResult | None = None
        self._newest = 0  # the newest cluster that gave a result

    def on_sent(self, cluster_id: int) -> None:
        self._sent[cluster_id] = self._sent.get(cluster_id, 0) + 1
        if len(self._sent) > KEPT_CLUSTERS:
            del self._sent[next(iter(self._sent))]

    def handle(self, result: PacketResult, cluster: ProbeCluster) -> ProbeResult | None:
        """Add a received probe packet; the cluster's rate once enough of it is in."""
        arrival = result.arrival
        send_time = result.sent.send_time
        stale = [
            cid
            for cid, c in self._clusters.items()
            if c.last_receive < arrival - MAX_CLUSTER_HISTORY_S
        ]
        for cid in stale:
            del self._clusters[cid]
        aggregate = self._clusters.setdefault(cluster.id, _Aggregate())
        bits = result.sent.size * 8
        if send_time < aggregate.first_send:
            aggregate.first_send = send_time
        if send_time > aggregate.last_send:
            aggregate.last_send = send_time
            aggregate.size_last_send = bits
        if arrival < aggregate.first_receive:
            aggregate.first_receive = arrival
            aggregate.size_first_receive = bits
        if arrival > aggregate.last_receive:
            aggregate.last_receive = arrival
        aggregate.size_total += bits
        aggregate.packets += 1
        aggregate.arrivals.append((arrival, bits))

        sent = max(cluster.min_packets, self._sent.get(cluster.id, 0))
        min_bits = cluster.min_bytes * 8 * MIN_RECEIVED_FRACTION
        if aggregate.packets < sent * MIN_RECEIVED_FRACTION or aggregate.size_total < min_bits:
            return None
        send_interval = aggregate.last_send - aggregate.first_send
        receive_interval = aggregate.last_receive - aggregate.first_receive
        if not (0 < send_interval <= MAX_PROBE_INTERVAL_S) or not (
            0 < receive_interval <= MAX_PROBE_INTERVAL_S
        ):
            return None
        # the interval misses the time to send the last packet and to receive the first
        send_rate = (aggregate.size_total - aggregate.size_last_send) / send_interval
        receive_rate = (aggregate.size_total - aggregate.size_first_receive) / receive_interval
        if send_rate <= 0 or receive_rate / send_rate > MAX_VALID_RATIO:
            return None
        rate = min(send_rate, receive_rate)
        saturated = receive_rate < MIN_RATIO_UNSATURATED * send_rate
        if saturated:
            # the probe found the capacity: a little under it, past a shaper's burst
            later = _later_half_rate(aggregate.arrivals)
            rate = TARGET_UTILIZATION * min(receive_rate, later or receive_rate)
        if cluster.id < self._newest:
            return None  # the late tail of an older cluster must not undo a newer result
        self._newest = cluster.id
        self._result = ProbeResult(rate, saturated)
        return self._result

    def fetch(self) -> ProbeResult | None:
        """The latest result not fetched yet."""
        result, self._result = self._result, None
        return result


class _State(Enum):
    WAITING = "waiting"  # for the result of probes that may lead to further probing
    COMPLETE = "complete"


class ProbeController:
    """Decides when and at what rates to probe. Clusters wait in a queue the pacer pops; the
    decisions depend only on the controller's inputs, not on when the pacer pops (so that a
    recorded session replays the same)."""

    def __init__(self, start: float, max_bitrate: float) -> None:
        self._max = max_bitrate
        self.estimate = start
        self._state = _State.COMPLETE
        self._min_further = 0.0
        self._further: tuple[float, float] | None = None  # a further probe's result, threshold
        self._initiated: float | None = None  # when the last probes were initiated
        self._pending: deque[tuple[float | None, ProbeCluster]] = deque()
        self._clusters: dict[int, ProbeCluster] = {}
        self._next_id = 1
        self._recent: deque[tuple[float, float]] = deque()  # (time, estimate), max first
        self._drop_time: float | None = None
        self._before_drop = 0.0
        self._recovering = False
        self._recovery_at = 0.0
        self._recovery_interval = RECOVERY_INTERVAL_S
        self._last_drop_probe: float | None = None
        self._initiate(
            None, [FIRST_EXPONENTIAL_SCALE * start, SECOND_EXPONENTIAL_SCALE * start], True
        )

    @property
    def probing(self) -> bool:
        return self._state is _State.WAITING or bool(self._pending)

    def cluster(self, cluster_id: int) -> ProbeCluster | None:
        return self._clusters.get(cluster_id)

    def clock(self, now: float) -> None:
        """The first time seen dates the probes created before any (the start-up probes)."""
        if self._initiated is None:
            self._initiated = now
            self._pending = deque((now if t is None else t, c) for t, c in self._pending)

    def pop(self, now: float) -> ProbeCluster | None:
        while self._pending:
            created, cluster = self._pending.popleft()
            if created is None or now - created <= MAX_WAITING_S:
                return cluster
        return None

    def set_max(self, max_bitrate: float, now: float | None) -> None:
        old, self._max = self._max, max_bitrate
        if self._state is _State.COMPLETE and old < max_bitrate and self.estimate < max_bitrate:
            self._initiate(now, [max_bitrate], False)  # libwebrtc's mid-call probing

    def set_estimate(self, bitrate: float, now: float) -> None:
        self.clock(now)
        previous = self.estimate
        self.estimate = bitrate
        if self._state is _State.WAITING and 0 < self._min_further < bitrate:
            self._recovery_interval = RECOVERY_INTERVAL_S  # the last probe succeeded
            if self._recovering:  # the link was narrow lately: a shaper's burst reads wide
                self._further = (now, self._min_further)
                self._min_further = 0.0
            else:
                self._initiate(now, [FURTHER_SCALE * bitrate], True)
        recent = self._recent
        while recent and now - recent[0][0] > BITRATE_DROP_TIMEOUT_S:
            recent.popleft()
        reference = recent[0][1] if recent else previous
        if bitrate < previous and bitrate < BITRATE_DROP_THRESHOLD * reference:
            self._drop_time = now
            # a drop in steps: recovery aims at the rate before the first
            self._before_drop = max(self._before_drop, reference) if self._recovering else reference
            self._recovering = True
            self._recovery_at = now + RECOVERY_INTERVAL_S
            self._recovery_interval = RECOVERY_INTERVAL_S
        elif self._recovering and bitrate >= RECOVERED_FRACTION * min(self._before_drop, self._max):
            self._recovering = False
        while recent and recent[-1][1] <= bitrate:
            recent.pop()
        recent.append((now, bitrate))

    def request_probe(self, now: float, alr_start: float | None, alr_end: float | None) -> None:
        """The delay detector recovered from overuse: if that followed a large drop in the
        last 5 s, probe near the rate before the drop (libwebrtc's RequestProbe). Only in the
        application-limited region or just after it, as libwebrtc: a stream that fills its
        estimate would burst at up to 6× the link the drop left (13.6 Mbit/s on 2 filled
        100 ms of queue), and the recovery probes look for a capacity that came back."""
        if self._state is not _State.COMPLETE or self._drop_time is None:
            return
        alr_recent = alr_end is not None and now - alr_end < ALR_ENDED_TIMEOUT_S
        if alr_start is None and not alr_recent:
            return
        suggested = PROBE_FRACTION_AFTER_DROP * self._before_drop
        last = self._last_drop_probe
        if (
            (1 - PROBE_UNCERTAINTY) * suggested > self.estimate
            and now - self._drop_time < BITRATE_DROP_TIMEOUT_S
            and (last is None or now - last > MIN_TIME_BETWEEN_DROP_PROBES_S)
        ):
            self._last_drop_probe = now
            self._initiate(now, [suggested], False)

    def process(self, now: float, alr_start: float | None, may_probe: bool) -> None:
        """`may_probe`: false while something a probe cannot lift (loss, REMB) holds the target
        down; the periodic probes (ALR, recovery) wait."""
        self.clock(now)
        if self._further is not None and now - self._further[0] >= FURTHER_WAIT_S:
            since, threshold = self._further
            self._further = None
            # unless the raise was undone meanwhile (the delay-based estimate's probe trial)
            if now - since <= MAX_WAITING_S and self.estimate > threshold:
                self._initiate(now, [FURTHER_SCALE * self.estimate], True)
        initiated = self._initiated if self._initiated is not None else now
        if self._state is _State.WAITING and now - initiated > MAX_WAITING_S:
            self._state = _State.COMPLETE  # no result in time: probing is over
            self._min_further = 0.0
        if self._state is not _State.COMPLETE or self.estimate >= self._max or not may_probe:
            return
        if alr_start is not None and now >= max(alr_start, initiated) + ALR_PROBING_INTERVAL_S:
            self._initiate(now, [ALR_PROBE_SCALE * self.estimate], True)
        elif self._recovering and now >= self._recovery_at:
            self._recovery_at = now + self._recovery_interval
            self._recovery_interval = min(
                self._recovery_interval + RECOVERY_INTERVAL_STEP_S, RECOVERY_MAX_INTERVAL_S
            )
            self._initiate(now, [RECOVERY_SCALE * self.estimate], True)

    def _initiate(self, now: float | None, bitrates: list[float], further: bool) -> None:
        last = 0.0
        for requested in bitrates:
            bitrate = requested
            if bitrate >= self._max:
                bitrate = self._max
                further = False
            if bitrate <= max(self.estimate, last):
                continue  # nothing to learn (or a second cluster capped at the max)
            cluster = ProbeCluster(
                self._next_id,
                int(bitrate),
                MIN_PROBE_PACKETS,
                max(int(bitrate * PROBE_DURATION_S / 8), 1),
            )
            self._next_id += 1
            self._pending.append((now, cluster))
            self._clusters[cluster.id] = cluster
            if len(self._clusters) > KEPT_CLUSTERS:
                del self._clusters[next(iter(self._clusters))]
            last = bitrate
        if not last:
            return
        self._initiated = now if now is not None else self._initiated
        if further:
            self._state = _State.WAITING
            self._min_further = FURTHER_THRESHOLD * last
        else:
            self._state = _State.COMPLETE
            self._min_further = 0.0
