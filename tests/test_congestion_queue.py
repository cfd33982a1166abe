"""The standing queue on the path (transport/congestion/queue_delay.py), the controller's
drain of it and the delay-based estimate's reading of it: measured on made-up feedback, then
on the simulated 20 → 2 Mbit/s step against the same controller without each."""

from __future__ import annotations

import pytest

from render_server.transport.congestion import CongestionController, delay_based, probing
from render_server.transport.congestion import queue_delay as queue_module
from render_server.transport.congestion.queue_delay import (
    ALLOWANCE_S,
    DRAIN_S,
    MIN_FACTOR,
    STALE_S,
    QueueDelay,
)
from render_server.transport.congestion.types import PacketFeedback, PacketResult, SentPacket

from .congestion_sim import Link, Simulation, first_time, steps

OFFSET = 1234.5  # the receiver's clock has an origin of its own


def report(first: int, sent: float, one_way: list[float]) -> list[PacketResult]:
    """Packets sent 1 ms apart from `sent`, each `one_way` seconds on the path."""
    return [
        PacketResult(SentPacket(first + i, 1200, sent + i * 0.001), OFFSET + sent + i * 0.001 + d)
        for i, d in enumerate(one_way)
    ]


def send_and_ack(controller: CongestionController, now: float, packets: list[PacketResult]) -> None:
    for p in packets:
        controller.on_packet_sent(p.sent)
    controller.on_feedback(now, [PacketFeedback(p.sent.sequence, p.arrival) for p in packets])


def test_no_queue_and_no_drain_before_any_feedback() -> None:
    queue = QueueDelay()
    assert queue.queue(5.0) == 0.0
    assert queue.factor(5.0) == 1.0


def test_the_queue_is_the_delay_over_its_minimum_and_drains_what_stands_over_the_allowance() -> (
    None
):
    queue = QueueDelay()
    queue.update(1.0, report(0, 0.9, [0.020, 0.021, 0.022]))
    assert queue.queue(1.0) == pytest.approx(0.0)
    assert queue.factor(1.0) == 1.0
    queue.update(2.0, report(3, 1.9, [0.030, 0.031]))  # 10 ms: jitter, no drain
    assert queue.queue(2.0) == pytest.approx(0.010)
    assert queue.factor(2.0) == 1.0
    queue.update(3.0, report(5, 2.9, [0.220, 0.230, 0.240]))  # 200 ms standing
    assert queue.queue(3.0) == pytest.approx(0.200)
    assert queue.factor(3.0) == pytest.approx(1.0 - (0.200 - ALLOWANCE_S) / DRAIN_S)
    queue.update(3.1, report(8, 3.0, [0.900, 0.910]))  # a huge queue: never under the floor
    assert queue.factor(3.1) == MIN_FACTOR


def test_one_late_packet_is_jitter_but_a_whole_late_report_is_a_queue() -> None:
    queue = QueueDelay()
    queue.update(1.0, report(0, 0.9, [0.020] * 5))
    queue.update(1.05, report(5, 0.95, [0.020, 0.020, 0.300, 0.020]))
    assert queue.factor(1.05) == 1.0
    queue.update(1.1, report(9, 1.0, [0.150, 0.160, 0.170]))
    assert queue.factor(1.1) < 1.0


def test_a_stale_measurement_says_nothing() -> None:
    queue = QueueDelay()
    queue.update(1.0, report(0, 0.9, [0.020]))
    queue.update(1.1, report(1, 1.0, [0.300]))
    assert queue.factor(1.1) < 1.0
    assert queue.factor(1.1 + STALE_S + 0.01) == 1.0


def test_a_jump_of_the_receivers_clock_is_not_a_queue() -> None:
    queue = QueueDelay()
    queue.update(1.0, report(0, 0.9, [0.020]))
    queue.update(1.1, report(1, 1.0, [100.0]))  # the receiver's clock jumped 100 s
    assert queue.queue(1.1) == 0.0
    queue.update(1.2, report(2, 1.1, [100.2]))  # and from there a queue is a queue again
    assert queue.queue(1.2) == pytest.approx(0.2)


def test_the_base_follows_a_path_that_got_longer_after_the_window() -> None:
    queue = QueueDelay()
    queue.update(1.0, report(0, 0.9, [0.020]))
    for i in range(1, 14):  # a route 60 ms longer from 1 s on: a queue at first, then not
        queue.update(1.0 + i, report(i, 0.9 + i, [0.080]))
    assert queue.queue(14.0) == pytest.approx(0.0)


def test_the_controller_asks_the_encoder_for_less_than_the_estimate_while_a_queue_stands() -> None:
    controller = CongestionController(2_000_000, 100_000, 10_000_000)
    for i, t in enumerate((0.1, 0.2, 0.3)):
        send_and_ack(controller, t + 0.05, report(100 * i, t, [0.02] * 10))
    assert controller.target_bitrate == controller.estimate
    send_and_ack(controller, 0.45, report(300, 0.4, [0.25] * 10))
    assert controller.queue_delay == pytest.approx(0.23)
    assert controller.target_bitrate < 0.6 * controller.estimate
    assert controller.pacing_bitrate == int(controller.estimate * controller.pacing_factor)
    assert controller.state().path_queue == pytest.approx(0.23)


def drained_after(monkeypatch: pytest.MonkeyPatch, drain: bool) -> tuple[float, int]:
    """Seconds from the step down until the queue it filled is under 50 ms again, and the
    packets the bottleneck dropped."""
    with monkeypatch.context() as patch:
        if not drain:
            patch.setattr(queue_module, "MIN_FACTOR", 1.0)
            patch.setattr(queue_module, "DRAIN_S", float("inf"))
        controller = CongestionController(2_000_000, 100_000, 16_000_000)
        sim = Simulation(controller, Link(steps((0, 20e6), (10.0, 2e6))))
        sim.run(14.0)
    full = first_time(sim.samples, 10.0, lambda s: s.queue_delay >= 0.2)
    assert full is not None  # the step filled the queue
    settled = first_time(sim.samples, full, lambda s: s.queue_delay < 0.05)
    assert settled is not None
    return settled - 10.0, sim.dropped


def test_the_drain_empties_the_queue_a_step_down_left_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours, dropped = drained_after(monkeypatch, drain=True)
    without, dropped_without = drained_after(monkeypatch, drain=False)
    assert ours < without
    assert ours <= 1.5
    assert dropped < dropped_without


def low_phase(monkeypatch: pytest.MonkeyPatch, read_queue: bool) -> tuple[float, float, int]:
    """From 3 s after a 20 → 2 Mbit/s step until the step back up (the climb back towards the
    link): the longest queue wait, the share of the time a queue over 20 ms stood, and the
    highest target."""
    with monkeypatch.context() as patch:
        # the queue's reading alone: no saturated probe's ceiling (which caps this climb too),
        # and further probes at once, as libwebrtc's
        patch.setattr(delay_based, "CEILING_S", 0.0)
        patch.setattr(probing, "FURTHER_WAIT_S", 0.0)
        if not read_queue:
            patch.setattr(delay_based, "QUEUE_HOLD_S", float("inf"))
            patch.setattr(delay_based, "QUEUE_OVERUSE_S", float("inf"))
        controller = CongestionController(2_000_000, 100_000, 16_000_000)
        sim = Simulation(controller, Link(steps((0, 20e6), (10.0, 2e6), (20.0, 20e6))))
        sim.run(30.0)
    low = [s for s in sim.samples if 13.0 <= s.t < 20.0]
    back = first_time(sim.samples, 20.0, lambda s: s.target >= 0.8 * 16e6)
    assert back is not None and back - 20.0 <= 10.0  # and the way back up is not blocked
    standing = sum(s.queue_delay > ALLOWANCE_S for s in low) / len(low)
    return max(s.queue_delay for s in low), standing, max(s.target for s in low)


def test_a_standing_queue_stops_the_climb_after_a_drop_at_the_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trendline sees a queue only while it grows: without reading the standing queue the
    climb overfills the 2 Mbit/s link (a target of 2.12 Mbit/s) and a queue over 20 ms stands
    26 % of the time, against 11 % (the longest waits, ~50 ms, are the recovery probes' in
    both)."""
    queue, standing, target = low_phase(monkeypatch, read_queue=True)
    queue_without, standing_without, target_without = low_phase(monkeypatch, read_queue=False)
    print(f"low phase: queue over 20 ms {standing:.0%} of the time, longest {queue * 1e3:.0f} ms, "
          f"target {target / 1e6:.2f} Mbit/s; without: {standing_without:.0%}, "
          f"{queue_without * 1e3:.0f} ms, {target_without / 1e6:.2f} Mbit/s")  # fmt: skip
    assert queue <= 2 * ALLOWANCE_S + 0.015
    assert standing < 0.6 * standing_without
    assert target <= 2_000_000 < target_without
