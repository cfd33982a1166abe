"""The congestion controller's parts, each fed by hand: groups, the trendline detector, AIMD,
the delay-based estimate's reading of the standing queue, throughput, loss, probing and the
send history."""

from __future__ import annotations

import random

import pytest

from render_server.transport.congestion.aimd import BACKOFF, AimdRateControl
from render_server.transport.congestion.delay_based import (
    CEILING_S,
    PROBE_TRIAL_S,
    QUEUE_HOLD_S,
    QUEUE_OVERUSE_S,
    DelayBasedBwe,
)
from render_server.transport.congestion.history import MAX_PACKETS, SendHistory
from render_server.transport.congestion.inter_arrival import Deltas, InterArrival
from render_server.transport.congestion.loss import LossBasedBwe
from render_server.transport.congestion.probing import (
    FURTHER_WAIT_S,
    ProbeBitrateEstimator,
    ProbeController,
    ProbeResult,
)
from render_server.transport.congestion.throughput import AcknowledgedBitrate
from render_server.transport.congestion.trendline import TrendlineEstimator
from render_server.transport.congestion.types import (
    BandwidthUsage,
    PacketFeedback,
    PacketResult,
    ProbeCluster,
    SentPacket,
)

from .gc_visits import gc_visits

# inter-arrival groups


def feed(ia: InterArrival, packets: list[tuple[float, float, int]]) -> list[Deltas]:
    """(send, arrival, size) in order, the feedback coming 50 ms after the send (on the
    sender's clock); the deltas that came out."""
    out = []
    for send, arrival, size in packets:
        deltas = ia.compute(send, arrival, send + 0.05, size)
        if deltas is not None:
            out.append(deltas)
    return out


def test_groups_are_5ms_of_send_time_and_deltas_come_between_complete_groups() -> None:
    # three bursts 10 ms apart, 3 packets 1 ms apart each; the second burst queued 4 ms more
    a = [(0.000, 0.050, 100), (0.001, 0.051, 100), (0.002, 0.052, 100)]
    b = [(0.010, 0.064, 200), (0.011, 0.065, 200), (0.012, 0.066, 200)]
    c = [(0.020, 0.076, 300)]
    out = feed(InterArrival(), a + b + c)
    assert len(out) == 1  # the pair (a, b), once c's first packet closed b
    (deltas,) = out
    assert deltas.send == pytest.approx(0.010)  # last send of b - last send of a
    assert deltas.arrival == pytest.approx(0.014)  # last arrival of b - last arrival of a
    assert deltas.size == 600 - 300


def test_a_packet_sent_before_the_current_group_is_ignored() -> None:
    ia = InterArrival()
    a = [(0.000, 0.050, 100), (0.010, 0.060, 100)]  # two groups
    assert feed(ia, a) == []
    assert ia.compute(0.005, 0.061, 0.061, 100) is None  # reordered: before group 2's start
    out = feed(ia, [(0.020, 0.070, 100)])
    assert len(out) == 1
    assert out[0].size == 0  # the reordered packet's bytes were not added to group 2


def test_packets_arriving_closer_than_sent_are_one_burst() -> None:
    # sent 8 ms apart but arrived 1 ms apart (queued together): one group, not two
    ia = InterArrival()
    packets = [(0.000, 0.100, 100), (0.008, 0.101, 100), (0.020, 0.120, 100), (0.030, 0.130, 1)]
    out = feed(ia, packets)
    assert len(out) == 1
    assert out[0].send == pytest.approx(0.020 - 0.008)  # the burst's last send time
    assert out[0].size == 100 - 200


def test_an_arrival_clock_jump_resets_the_groups() -> None:
    ia = InterArrival()
    before = feed(ia, [(i * 0.01, 1 + i * 0.01, 100) for i in range(5)])
    # the receiver's clock jumps 10 s ahead, the sender's does not
    after = feed(ia, [(0.05 + i * 0.01, 11.05 + i * 0.01, 100) for i in range(6)])
    assert len(before) == 3
    assert len(after) >= 2  # deltas again, once two new groups are complete
    assert all(d.arrival == pytest.approx(0.01) for d in before + after)  # never the jump


def test_arrivals_going_back_give_no_deltas_until_they_are_in_order_again() -> None:
    ia = InterArrival()
    normal = feed(ia, [(i * 0.01, 5 + i * 0.01, 100) for i in range(4)])
    back = feed(ia, [(0.04 + i * 0.01, 4.0 - i, 100) for i in range(4)])  # 1 s back each
    after = feed(ia, [(0.08 + i * 0.01, 1.01 + i * 0.01, 100) for i in range(5)])
    assert len(after) >= 2
    assert all(d.arrival == pytest.approx(0.01) for d in normal + back + after)


# the trendline detector


def trend(
    extra_delay: float, groups: int = 200, jitter: float = 0.0, queue: float = 0.0
) -> list[BandwidthUsage]:
    """Groups 5 ms apart, each arriving `extra_delay` s later than the last (a queue that
    grows for > 0), with bounded random jitter on the arrival times."""
    rng = random.Random(3)
    detector = TrendlineEstimator()
    states = []
    prev = None
    for i in range(groups):
        send = i * 0.005
        queue = max(queue + extra_delay, 0.0)
        arrival = send + 0.04 + queue + rng.uniform(0, jitter)
        if prev is not None:
            states.append(detector.update(arrival - prev[1], send - prev[0], arrival))
        prev = (send, arrival)
    return states


def test_trendline_detects_overuse_on_growing_delay() -> None:
    states = trend(0.0005)  # 0.5 ms more per 5 ms: sending 10 % above the capacity
    assert BandwidthUsage.OVERUSING in states[:40]
    assert BandwidthUsage.UNDERUSING not in states


def test_trendline_does_not_detect_overuse_on_constant_delay() -> None:
    assert set(trend(0.0)) == {BandwidthUsage.NORMAL}
    assert set(trend(0.0, 1000, jitter=0.005)) == {BandwidthUsage.NORMAL}  # 5 ms of jitter


def test_trendline_detects_underuse_when_the_queue_drains() -> None:
    states = trend(-0.001, 150, queue=0.3)  # a 300 ms queue draining 1 ms per group
    assert BandwidthUsage.UNDERUSING in states
    assert BandwidthUsage.OVERUSING not in states


# AIMD


def test_overuse_backs_off_to_085_of_the_throughput() -> None:
    aimd = AimdRateControl(5e6, 1e5, 20e6)
    assert aimd.update(BandwidthUsage.OVERUSING, 4e6, 1.0) == pytest.approx(BACKOFF * 4e6)
    # and no further until the queue drained (hold), however long it overuses within the rtt
    aimd.update(BandwidthUsage.NORMAL, 4e6, 1.05)
    assert aimd.estimate == pytest.approx(BACKOFF * 4e6, rel=1e-3)


def test_increase_is_multiplicative_far_from_capacity_and_additive_near_it() -> None:
    far = AimdRateControl(2e6, 1e5, 20e6)
    for i in range(21):  # 1 s of feedback every 50 ms, throughput keeping up
        far.update(BandwidthUsage.NORMAL, far.estimate, i * 0.05)
    assert 1.05 < far.estimate / 2e6 < 1.12  # ~8 %/s

    near = AimdRateControl(2.4e6, 1e5, 20e6)
    near.update(BandwidthUsage.OVERUSING, 2.4e6, 0.0)  # the capacity is known now
    start = near.estimate
    near.rtt = 0.05
    for i in range(1, 22):
        near.update(BandwidthUsage.NORMAL, near.estimate, i * 0.05)
    assert 1.0 < near.estimate / start < 1.02  # a packet or so per response time


def test_the_estimate_stays_near_the_acknowledged_rate_unless_a_probe_says_more() -> None:
    aimd = AimdRateControl(2e6, 1e5, 20e6)
    for i in range(200):  # 10 s of increase while only 1 Mbit/s is acknowledged
        aimd.update(BandwidthUsage.NORMAL, 1e6, i * 0.05)
    assert aimd.estimate <= 2e6  # it started above the limit: no increase at all
    aimd2 = AimdRateControl(1e6, 1e5, 20e6)
    for i in range(200):
        aimd2.update(BandwidthUsage.NORMAL, 1e6, i * 0.05)
    assert aimd2.estimate == pytest.approx(1.5 * 1e6 + 10_000)
    aimd2.set_estimate(8e6, 10.0)  # a probe
    aimd2.update(BandwidthUsage.NORMAL, 1e6, 10.05)
    assert aimd2.estimate == 8e6


# throughput


def packets(rate: float, start: float, seconds: float, first_seq: int = 0) -> list[PacketResult]:
    """1200-byte packets at `rate` bits/s, arriving 30 ms after they were sent."""
    interval = 1200 * 8 / rate
    count = int(seconds / interval)
    return [
        PacketResult(
            SentPacket(first_seq + i, 1200, start + i * interval), start + i * interval + 0.03
        )
        for i in range(count)
    ]


def test_throughput_reads_the_rate_and_follows_a_drop_within_the_window() -> None:
    estimator = AcknowledgedBitrate()
    assert estimator.bitrate is None
    steady = packets(8e6, 0.0, 2.0)
    estimator.update(steady)
    assert estimator.bitrate == pytest.approx(8e6, rel=0.02)
    # the bottleneck now delivers 2 Mbit/s: the packets arrive spread out
    slow = [
        PacketResult(SentPacket(10_000 + i, 1200, 2.0 + i * 0.0012), 2.03 + i * 0.0048)
        for i in range(130)  # 0.62 s of arrivals
    ]
    for i in range(0, 130, 10):
        estimator.update(slow[i : i + 10])
    assert estimator.bitrate == pytest.approx(2e6, rel=0.05)


def test_throughput_survives_the_arrival_clock_going_back() -> None:
    estimator = AcknowledgedBitrate()
    estimator.update(packets(4e6, 0.0, 1.0))
    jumped = [PacketResult(r.sent, r.arrival - 100) for r in packets(4e6, 1.0, 1.0, 10_000)]
    estimator.update(jumped)
    assert estimator.bitrate == pytest.approx(4e6, rel=0.05)


# loss


def lossy(bwe: LossBasedBwe, fraction: float, seconds: float, start: float) -> float:
    """Feedback every 50 ms of 40 packets, `fraction` of them lost; returns the end time."""
    t = start
    lost_total = 0.0
    while t < start + seconds:
        t = round(t + 0.05, 6)
        lost_total += 40 * fraction
        lost = int(lost_total)
        lost_total -= lost
        bwe.on_feedback(lost, 40, t)
        bwe.update(t)
    return t


def test_loss_below_2_percent_lets_the_bound_rise_8_percent_a_second() -> None:
    bwe = LossBasedBwe(2e6, 1e5, 20e6)
    bwe.set_delay_limit(10e6)
    t = lossy(bwe, 0.0, 2.5, 0.0)  # past the start phase
    before = bwe.estimate
    lossy(bwe, 0.01, 2.0, t)
    assert 1.10 < bwe.estimate / before < 1.25  # 8 %/s for 2 s: ~1.17


def test_loss_between_2_and_10_percent_holds_and_above_10_decreases() -> None:
    bwe = LossBasedBwe(4e6, 1e5, 20e6)
    bwe.set_delay_limit(4e6)
    t = lossy(bwe, 0.0, 2.5, 0.0)  # past the start phase, at 4 Mbit/s
    bwe.set_delay_limit(10e6)  # room above
    t = lossy(bwe, 0.05, 1.0, t)  # the first 5 % window ends the increase
    held = bwe.estimate
    t = lossy(bwe, 0.05, 4.0, t)
    assert bwe.estimate == held < 4.5e6  # held: no increase at 5 %
    assert bwe.fraction_loss == pytest.approx(0.05, abs=0.01)
    lossy(bwe, 0.2, 3.0, t)
    # 1 - 0.5 * 0.2 = 0.9 once a window (0.5 s, and 300 ms + rtt apart): ~6 decreases
    assert held * 0.9**7 < bwe.estimate < held * 0.9**4


def test_loss_that_fec_repairs_does_not_hold_the_bound() -> None:
    def after(tolerance: float) -> float:
        bwe = LossBasedBwe(2e6, 1e5, 20e6)
        bwe.tolerance = tolerance
        bwe.set_delay_limit(10e6)
        t = lossy(bwe, 0.0, 2.5, 0.0)  # past the start phase
        before = bwe.estimate
        lossy(bwe, 0.04, 3.0, t)  # 4 % random loss
        return bwe.estimate / before

    assert after(0.0) < 1.10  # held after the first lossy window: 4 % is between the thresholds
    assert after(0.03) > 1.15  # 1 % left after what FEC repairs: it climbs 8 %/s


def test_the_loss_bound_never_exceeds_the_delay_based_estimate() -> None:
    bwe = LossBasedBwe(2e6, 1e5, 20e6)
    bwe.set_delay_limit(3e6)
    lossy(bwe, 0.0, 30.0, 0.0)
    assert bwe.estimate == 3e6
    bwe.set_delay_limit(1e6)
    assert bwe.estimate == 1e6


def test_a_loss_window_needs_20_packets() -> None:
    bwe = LossBasedBwe(2e6, 1e5, 20e6)
    for i in range(19):
        bwe.on_feedback(1, 1, i * 0.1)  # 19 packets in 1.8 s, all lost
    assert bwe.fraction_loss == 0.0
    bwe.on_feedback(0, 1, 2.0)
    assert bwe.fraction_loss == pytest.approx(19 / 20)


# probing


def probe_results(
    cluster: ProbeCluster, send_rate: float, receive_rate: float, count: int = 10
) -> list[PacketResult]:
    return [
        PacketResult(
            SentPacket(i, 1200, 1.0 + i * 1200 * 8 / send_rate, cluster.id),
            2.0 + i * 1200 * 8 / receive_rate,
        )
        for i in range(count)
    ]


def estimate(cluster: ProbeCluster, results: list[PacketResult]) -> float | None:
    estimator = ProbeBitrateEstimator()
    for result in results:
        estimator.handle(result, cluster)
    result = estimator.fetch()
    return None if result is None else result.bitrate


def test_a_probe_measures_what_got_through() -> None:
    cluster = ProbeCluster(1, 4_000_000, 5, 7500)
    assert estimate(cluster, probe_results(cluster, 4e6, 4e6)) == pytest.approx(4e6, rel=0.01)
    # received at half the rate: the link's capacity, a little under
    saturated = estimate(cluster, probe_results(cluster, 4e6, 2e6))
    assert saturated == pytest.approx(0.95 * 2e6, rel=0.01)


def test_a_probe_needs_80_percent_of_its_packets_and_bytes() -> None:
    cluster = ProbeCluster(1, 4_000_000, 5, 12_000)  # 10 packets' worth of bytes
    assert estimate(cluster, probe_results(cluster, 4e6, 4e6, 7)) is None
    assert estimate(cluster, probe_results(cluster, 4e6, 4e6, 8)) is not None


def test_a_probe_through_a_shapers_bucket_reads_the_link_not_the_burst() -> None:
    """A 2 Mbit/s link whose token bucket holds ~2.5 packets: the first three of a 4 Mbit/s
    probe's eleven pass at once, the rest at the link's rate. Over all eleven the receive
    rate reads 2.5 Mbit/s; the later half, past the burst, reads the link."""
    cluster = ProbeCluster(1, 4_000_000, 5, 7500)
    estimator = ProbeBitrateEstimator()
    spacing = 1200 * 8 / 2e6
    arrivals = [2.0, 2.0001, 2.0002] + [2.0002 + i * spacing for i in range(1, 9)]
    for i, arrival in enumerate(arrivals):
        estimator.on_sent(cluster.id)
        sent = SentPacket(i, 1200, 1.0 + i * 1200 * 8 / 4e6, cluster.id)
        estimator.handle(PacketResult(sent, arrival), cluster)
    result = estimator.fetch()
    assert result is not None and result.saturated
    assert result.bitrate == pytest.approx(0.95 * 2e6, rel=0.01)


def test_a_probe_waits_for_80_percent_of_the_packets_the_pacer_sent() -> None:
    """The pacer sent 11 packets for a cluster planned at 5: a result from the first 5 would
    read only their spacing."""
    cluster = ProbeCluster(1, 4_000_000, 5, 3000)
    estimator = ProbeBitrateEstimator()
    results = probe_results(cluster, 4e6, 4e6, 11)
    for _ in results:
        estimator.on_sent(cluster.id)
    for result in results[:8]:
        estimator.handle(result, cluster)
    assert estimator.fetch() is None
    estimator.handle(results[8], cluster)
    result = estimator.fetch()
    assert result is not None and not result.saturated
    assert result.bitrate == pytest.approx(4e6, rel=0.01)


def test_a_probe_bunched_by_a_queue_is_rejected() -> None:
    cluster = ProbeCluster(1, 4_000_000, 5, 7500)
    # received at 3× the rate it was sent at: a queue let them go back to back
    assert estimate(cluster, probe_results(cluster, 4e6, 12e6)) is None


def test_an_older_clusters_tail_does_not_override_a_newer_result() -> None:
    old, new = ProbeCluster(1, 2_000_000, 5, 3750), ProbeCluster(2, 8_000_000, 5, 15_000)
    estimator = ProbeBitrateEstimator()
    for result in probe_results(new, 8e6, 8e6, 14):
        estimator.handle(result, new)
    for result in probe_results(old, 2e6, 2e6, 6):
        estimator.handle(result, old)
    result = estimator.fetch()
    assert result is not None and result.bitrate == pytest.approx(8e6, rel=0.01)


def drain(probes: ProbeController, now: float) -> list[int]:
    out = []
    while (cluster := probes.pop(now)) is not None:
        out.append(cluster.bitrate)
    return out


def test_start_up_probes_and_further_probing_while_results_reach_70_percent() -> None:
    probes = ProbeController(1e6, 20e6)
    assert drain(probes, 0.0) == [3_000_000, 6_000_000]
    assert drain(probes, 0.0) == []  # popped once
    probes.set_estimate(3e6, 0.1)  # the first result: under 70 % of 6 Mbit/s
    assert drain(probes, 0.1) == []
    probes.set_estimate(5.9e6, 0.15)
    assert drain(probes, 0.15) == [11_800_000]
    probes.set_estimate(8e6, 0.3)  # 8 < 0.7 × 11.8: the capacity is found
    assert drain(probes, 0.3) == []
    probes.process(2.0, None, True)
    assert not probes.probing


def test_probes_never_exceed_the_max() -> None:
    probes = ProbeController(4e6, 10e6)
    assert drain(probes, 0.0) == [10_000_000]  # 12 and 24, both capped: one probe
    probes.set_estimate(10e6, 0.1)
    assert drain(probes, 0.1) == []


def test_a_large_drop_brings_recovery_probes_until_the_rate_is_back() -> None:
    probes = ProbeController(10e6, 16e6)
    drain(probes, 0.0)
    probes.set_estimate(16e6, 0.1)
    t = 0.1
    for t10 in range(2, 30):  # 3 s at the max
        t = t10 * 0.1
        probes.set_estimate(16e6, t)
        probes.process(t, None, True)
    probes.set_estimate(2e6, 3.0)  # the capacity dropped
    sent: list[tuple[float, int]] = []
    for step in range(1, 200):  # 10 s at 2 Mbit/s
        t = 3.0 + step * 0.05
        probes.set_estimate(2e6, t)
        probes.process(t, None, True)
        sent += [(t, bitrate) for bitrate in drain(probes, t)]
    assert sent, "no recovery probe"
    assert sent[0][0] == pytest.approx(5.5, abs=0.06)  # 2.5 s after the drop
    assert all(bitrate == 4_000_000 for _, bitrate in sent)
    gaps = [b[0] - a[0] for a, b in zip(sent, sent[1:], strict=False)]
    assert all(2.4 < gap <= 5.05 for gap in gaps)  # every 2.5 s, backing off to 5 s
    assert len(sent) >= 3
    probes.set_estimate(14e6, 13.1)  # recovered (probe results)
    probes.process(20.0, None, True)
    assert drain(probes, 20.0) == []


def test_the_probe_at_the_rate_before_a_drop_is_only_for_an_application_limited_stream() -> None:
    """libwebrtc's RequestProbe: a stream that fills its estimate would burst at 0.85 × the
    old rate into the narrower link (13.6 Mbit/s into 2 filled 100 ms of queue)."""
    for alr_start, expected in ((None, []), (2.5, [13_600_000])):
        probes = ProbeController(16e6, 16e6)
        drain(probes, 0.0)
        for t10 in range(1, 30):
            probes.set_estimate(16e6, t10 * 0.1)
        probes.set_estimate(2e6, 3.0)  # a large drop
        probes.request_probe(3.5, alr_start, None)
        assert drain(probes, 3.5) == expected
    probes = ProbeController(16e6, 16e6)  # an application-limited region just ended
    drain(probes, 0.0)
    probes.set_estimate(2e6, 3.0)
    probes.request_probe(3.5, None, 2.0)
    assert drain(probes, 3.5) == [13_600_000]


def test_while_recovering_a_further_probe_waits_for_the_raise_to_hold() -> None:
    """After a large drop, a recovery probe read wide (a shaper's burst, or a link that came
    back) probes further only FURTHER_WAIT_S later, and not if the raise was undone."""
    for undone in (False, True):
        probes = ProbeController(16e6, 16e6)
        drain(probes, 0.0)
        probes.set_estimate(16e6, 0.1)
        probes.set_estimate(2e6, 1.0)  # a large drop
        t, sent = 1.0, []
        while not sent:  # the first recovery probe, at 4 Mbit/s
            t += 0.05
            probes.set_estimate(2e6, t)
            probes.process(t, None, True)
            sent = drain(probes, t)
        assert sent == [4_000_000]
        probes.set_estimate(3.5e6, t + 0.1)  # its result: over 70 % of 4 Mbit/s
        assert drain(probes, t + 0.1) == []  # no further probe yet
        if undone:
            probes.set_estimate(2e6, t + 0.2)  # the delay-based estimate's trial undid it
        probes.process(t + 0.1 + FURTHER_WAIT_S, None, True)
        expected = [] if undone else [7_000_000]
        assert drain(probes, t + 0.1 + FURTHER_WAIT_S) == expected


def test_raising_the_max_probes_at_the_new_max() -> None:
    probes = ProbeController(2e6, 4e6)
    drain(probes, 0.0)
    probes.set_estimate(4e6, 0.1)
    probes.process(1.5, None, True)
    probes.set_max(10e6, 1.5)
    assert drain(probes, 1.5) == [10_000_000]


# the send history


def test_history_is_bounded_and_ignores_unknown_and_repeated_feedback() -> None:
    history = SendHistory()
    for i in range(MAX_PACKETS + 500):
        assert history.add(SentPacket(i, 1000, i * 1e-4))
    assert len(history) == MAX_PACKETS
    assert not history.add(SentPacket(MAX_PACKETS, 1000, 5.0))  # a repeated sequence number
    report = [PacketFeedback(s, 1.0) for s in (0, 499, 600, 601, 601)] + [
        PacketFeedback(10**9, 1.0)
    ]
    matched = history.match(report)
    assert [r.sent.sequence for r in matched.received] == [600, 601]  # 0, 499: forgotten
    assert history.match(report).received == []  # reported already


def test_a_cleared_history_matches_nothing_and_takes_new_packets() -> None:
    history = SendHistory()
    for i in range(10):
        history.add(SentPacket(i, 1000, i * 1e-3))
    history.clear()
    assert len(history) == 0
    assert history.match([PacketFeedback(3, 1.0)]).received == []
    assert history.add(SentPacket(3, 1000, 0.5)) and len(history) == 1


def test_history_counts_a_late_arrival_once_and_takes_back_its_loss() -> None:
    history = SendHistory()
    for i in range(4):
        history.add(SentPacket(i, 1000, i * 0.01))
    first = history.match(
        [PacketFeedback(0, 1.0), PacketFeedback(1, None), PacketFeedback(2, None)]
    )
    assert (first.lost, first.reported, len(first.received)) == (2, 3, 1)
    again = history.match([PacketFeedback(1, None), PacketFeedback(2, 1.2), PacketFeedback(3, 1.3)])
    assert (again.lost, again.reported, len(again.received)) == (-1, 1, 2)


def test_a_full_history_gives_a_full_collection_nothing_to_walk() -> None:
    """A 4K60 stream under transport-cc keeps MAX_PACKETS packets: the collector that stops
    every stream of the process must not visit them one by one."""
    history = SendHistory()
    for i in range(MAX_PACKETS):
        history.add(SentPacket(i, 1200, i * 4e-4, None if i % 7 else 3))
    history.match([PacketFeedback(s, 1.0 + s * 4e-4) for s in range(0, MAX_PACKETS, 2)])
    history.match([PacketFeedback(s, None) for s in range(1, 101, 2)])
    assert len(history) == MAX_PACKETS
    assert gc_visits(history) < 50


def test_the_history_forgets_by_time_and_by_count_and_keeps_the_cluster() -> None:
    history = SendHistory()
    assert history.add(SentPacket(7, 900, 0.0, 2))
    assert history.add(SentPacket(8, 900, 4.0))
    assert [r.sent for r in history.match([PacketFeedback(7, 1.0)]).received] == [
        SentPacket(7, 900, 0.0, 2)
    ]
    assert history.add(SentPacket(9, 900, 5.5))  # 7 is now older than WINDOW_S
    assert history.match([PacketFeedback(7, 2.0)]).received == []
    assert len(history) == 2
    assert history.add(SentPacket(8 + MAX_PACKETS, 900, 5.6))  # 8's slot: 8 is forgotten
    assert [r.sent.sequence for r in history.match([PacketFeedback(8, 2.0)]).received] == []
    assert not history.add(SentPacket(8, 900, 5.7))  # older than the last MAX_PACKETS


# the delay-based estimate reads the standing queue


def steady_packets(t: float) -> list[PacketResult]:
    """50 ms of 2 Mbit/s sent from `t`, each 20 ms on the path (numbered by their send time)."""
    first = round(t * 200)
    return [
        PacketResult(SentPacket(first + i, 1250, t + i * 0.005), 500.0 + t + i * 0.005 + 0.02)
        for i in range(10)
    ]


def steady_delay(bwe: DelayBasedBwe, start: float, seconds: float, queue: float) -> float:
    """Reports every 50 ms of 2 Mbit/s at a constant one-way delay (the trendline sees no
    trend), acknowledged at 2 Mbit/s, while `queue` seconds stand on the path."""
    t = start
    while t < start + seconds:
        packets = steady_packets(t)
        t += 0.05
        bwe.on_feedback(packets, 2e6, None, t + 0.02, queue)
    return bwe.estimate


def test_a_standing_queue_holds_the_estimate_and_a_long_one_is_overuse() -> None:
    climbing = DelayBasedBwe(2e6, 1e5, 20e6)
    assert steady_delay(climbing, 0.0, 2.0, 0.0) > 2.05e6  # no queue: it climbs
    held = DelayBasedBwe(2e6, 1e5, 20e6)
    assert steady_delay(held, 0.0, 2.0, QUEUE_HOLD_S + 0.005) == pytest.approx(2e6)
    assert held.usage is BandwidthUsage.NORMAL  # the trend saw nothing: the queue held it
    cut = DelayBasedBwe(2e6, 1e5, 20e6)
    assert steady_delay(cut, 0.0, 0.5, QUEUE_OVERUSE_S + 0.005) == pytest.approx(BACKOFF * 2e6)


def test_a_probes_raise_that_a_queue_follows_is_undone_and_one_that_stands_a_second_stays() -> None:
    """A shaper lets its bucket's worth of a probe through at line speed: a 2 Mbit/s link read
    as 2.3. A queue within PROBE_TRIAL_S of the raise says so; after it, a queue only holds."""
    burst = DelayBasedBwe(2e6, 1e5, 20e6)
    steady_delay(burst, 0.0, 0.5, 0.0)
    before = burst.estimate
    burst.on_feedback(
        steady_packets(0.5), 2e6, ProbeResult(2.3e6, False), 0.57, 0.0
    )  # the probe's result
    assert burst.estimate == pytest.approx(2.3e6)
    burst.on_feedback(steady_packets(0.6), 2e6, None, 0.67, QUEUE_HOLD_S + 0.005)
    assert burst.estimate == pytest.approx(before)

    real = DelayBasedBwe(2e6, 1e5, 20e6)
    steady_delay(real, 0.0, 0.5, 0.0)
    real.on_feedback(steady_packets(0.5), 2e6, ProbeResult(2.3e6, False), 0.57, 0.0)
    steady_delay(real, 0.6, PROBE_TRIAL_S, 0.0)  # the trial passes without a queue
    raised = real.estimate
    assert raised >= 2.3e6
    real.on_feedback(steady_packets(2.0), 2e6, None, 2.07, QUEUE_HOLD_S + 0.005)
    assert real.estimate == pytest.approx(raised)  # held, not undone


def test_a_probe_that_filled_the_link_caps_the_climb_until_it_expires_or_one_gets_through() -> None:
    """The link measured at 2 Mbit/s (a result of 1.9): AIMD's climb stops there for
    CEILING_S, unless a probe that was not saturated measured more."""
    capped = DelayBasedBwe(1.5e6, 1e5, 20e6)
    steady_delay(capped, 0.0, 0.5, 0.0)
    capped.on_feedback(steady_packets(0.5), 2e6, ProbeResult(1.9e6, True), 0.57, 0.0)
    assert steady_delay(capped, 0.6, 3.0, 0.0) == pytest.approx(1.9e6)
    assert steady_delay(capped, 3.6, CEILING_S, 0.0) > 1.95e6  # expired: it climbs again

    free = DelayBasedBwe(1.5e6, 1e5, 20e6)
    steady_delay(free, 0.0, 0.5, 0.0)
    free.on_feedback(steady_packets(0.5), 2e6, ProbeResult(1.9e6, False), 0.57, 0.0)
    assert steady_delay(free, 0.6, 3.0, 0.0) > 1.95e6

    # nor does a later saturated probe through a shaper's full bucket raise it
    capped.on_feedback(steady_packets(8.7), 2e6, ProbeResult(1.9e6, True), 8.77, 0.0)
    capped.on_feedback(steady_packets(9.0), 2e6, ProbeResult(2.9e6, True), 9.07, 0.0)
    assert capped.estimate == pytest.approx(1.9e6)

    lifted = DelayBasedBwe(1.5e6, 1e5, 20e6)
    steady_delay(lifted, 0.0, 0.5, 0.0)
    lifted.on_feedback(steady_packets(0.5), 2e6, ProbeResult(1.9e6, True), 0.57, 0.0)
    steady_delay(lifted, 0.6, 1.0, 0.0)
    lifted.on_feedback(steady_packets(1.6), 2e6, ProbeResult(2.0e6, False), 1.67, 0.0)
    assert steady_delay(lifted, 1.7, 3.0, 0.0) > 2.05e6
