"""The controller on simulated links (tests/congestion_sim.py): ramp-up, capacity steps, loss.

Each scenario runs once per module; `python -m tests.congestion_sim` prints their figures.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from render_server.transport.congestion import CongestionController

from .congestion_sim import (
    Link,
    Sample,
    Simulation,
    first_time,
    run_loss,
    run_steady,
    run_step,
    steps,
)


def longest_run(samples: list[Sample], condition: Callable[[Sample], bool]) -> float:
    """The longest stretch of consecutive samples (seconds) for which `condition` held."""
    longest = current = 0.0
    previous = None
    for s in samples:
        if condition(s):
            current += s.t - previous if previous is not None else 0.0
            longest = max(longest, current)
        else:
            current = 0.0
        previous = s.t
    return longest


@pytest.fixture(scope="module")
def steady() -> Simulation:
    return run_steady(seconds=20.0, capacity=8e6)


@pytest.fixture(scope="module")
def step() -> Simulation:
    return run_step(down=10.0, up=20.0, seconds=30.0)


@pytest.fixture(scope="module")
def loss_2() -> Simulation:
    return run_loss(0.02, seconds=20.0)


@pytest.fixture(scope="module")
def loss_20() -> Simulation:
    return run_loss(0.2, seconds=20.0, start=5.0)


def test_steady_link_ramps_up_from_1_mbit_within_5_s(steady: Simulation) -> None:
    reached = first_time(steady.samples, 0.0, lambda s: s.target >= 0.7 * s.capacity)
    assert reached is not None and reached <= 5.0


def test_steady_link_is_used_without_overshooting_for_long(steady: Simulation) -> None:
    late = [s for s in steady.samples if s.t >= 5.0]
    mean = sum(s.target for s in late) / len(late)
    assert 0.75 * 8e6 <= mean <= 8e6
    over = longest_run(late, lambda s: s.target > 1.05 * s.capacity)
    assert over <= 1.0
    assert max(s.target for s in late) <= 1.2 * 8e6


def test_steady_link_keeps_the_queue_short(steady: Simulation) -> None:
    waits = sorted(s.queue_delay for s in steady.samples if s.t >= 5.0)
    assert waits[int(len(waits) * 0.95)] < 0.05  # a frame's burst at 2.5× the target, no more
    assert waits[-1] < 0.1
    assert steady.dropped == 0


def test_step_down_goes_under_2_mbit_within_2_s(step: Simulation) -> None:
    before = first_time(step.samples, 0.0, lambda s: s.target >= 0.8 * 16e6)
    assert before is not None and before < 10.0  # it was near the max before the step
    under = first_time(step.samples, 10.0, lambda s: s.target < 2e6)
    assert under is not None and under - 10.0 <= 2.0


def test_at_2_mbit_the_target_fits_without_collapsing(step: Simulation) -> None:
    low = [s for s in step.samples if 12.0 <= s.t < 20.0]
    mean = sum(s.target for s in low) / len(low)
    assert 1.2e6 <= mean <= 2e6
    assert longest_run(low, lambda s: s.target > 2.2e6) <= 0.5
    waits = sorted(s.queue_delay for s in low)
    assert waits[len(waits) // 2] < 0.05  # the queue the step filled was drained


def test_step_up_recovers_80_percent_of_the_max_within_10_s(step: Simulation) -> None:
    back = first_time(step.samples, 20.0, lambda s: s.target >= 0.8 * 16e6)
    assert back is not None and back - 20.0 <= 10.0
    last = [s.target for s in step.samples if s.t >= 28.0]
    assert sum(last) / len(last) >= 0.8 * 16e6  # and it stays there


def test_2_percent_random_loss_does_not_collapse_the_target(loss_2: Simulation) -> None:
    assert loss_2.lost > 100  # the loss happened
    late = [s.target for s in loss_2.samples if s.t >= 5.0]
    assert min(late) >= 0.5 * 8e6


def test_20_percent_loss_brings_the_target_down(loss_20: Simulation) -> None:
    before = [s.target for s in loss_20.samples if 3.0 <= s.t < 5.0]
    assert min(before) >= 0.7 * 8e6  # up to speed before the loss began at 5 s
    half = first_time(loss_20.samples, 5.0, lambda s: s.target < 0.5 * 8e6)
    assert half is not None and half - 5.0 <= 5.0
    late = [s.target for s in loss_20.samples if s.t >= 15.0]
    assert max(late) < 0.25 * 8e6


def test_an_application_limited_sender_keeps_its_estimate_by_probing() -> None:
    """A still picture: the encoder makes 1 Mbit/s whatever the target. Periodic probes keep
    the estimate at the link's capacity, and find it when it falls."""
    controller = CongestionController(1_000_000, 100_000, 20_000_000)
    link = Link(steps((0, 8e6), (12, 3e6)))
    sim = Simulation(controller, link, app_limit=1e6)
    sim.run(25.0)
    assert min(s.target for s in sim.samples if 3 <= s.t < 12) >= 0.7 * 8e6
    late = [s.target for s in sim.samples if s.t >= 20]
    assert 0.6 * 3e6 <= min(late) and max(late) <= 3e6
