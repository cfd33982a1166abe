"""Bandwidth steps: a low target makes the stream smaller, then slower; a recovered one brings
it back, with hysteresis."""

from __future__ import annotations

from render_server.config import Resolution, default_bitrate
from render_server.stream.bandwidth_steps import (
    DOWN_AFTER_S,
    FULL,
    STEPS,
    UP_AFTER_S,
    BandwidthSteps,
    Step,
)

HD = Resolution(1280, 720)


def run(steps: BandwidthSteps, target: int, start: float, seconds: float) -> list[int]:
    indices = []
    t = start
    while t < start + seconds:
        steps.observe(t, target, HD, 30.0)
        indices.append(steps.index)
        t += 0.5
    return indices


def test_steps_apply_size_first_then_frames() -> None:
    assert FULL.apply(HD, 30.0) == (HD, 30.0)
    assert Step(0.75, 1.0).apply(HD, 30.0) == (Resolution(960, 540), 30.0)
    assert Step(0.5, 0.5).apply(HD, 30.0) == (Resolution(640, 360), 15.0)
    scales = [s.scale for s in STEPS]
    shares = [s.frame_share for s in STEPS]
    assert scales == sorted(scales, reverse=True) and shares == sorted(shares, reverse=True)
    first_frame_step = next(i for i, s in enumerate(STEPS) if s.frame_share < 1)
    assert all(s.scale == STEPS[-1].scale for s in STEPS[first_frame_step:])


def test_a_target_that_stays_low_steps_down_after_a_while_and_not_at_once() -> None:
    steps = BandwidthSteps(default_bitrate)
    assert steps.observe(0.0, 500_000, HD, 30.0) is None  # one low reading is not enough
    indices = run(steps, 500_000, 0.5, 2 * DOWN_AFTER_S + 1.0)
    assert indices[0] == 0 and indices[-1] >= 2, indices  # 720p needs 2.8 Mbit/s
    assert steps.step.scale == 0.5


def test_a_target_that_suits_the_stream_never_steps() -> None:
    steps = BandwidthSteps(default_bitrate)
    assert set(run(steps, 2_000_000, 0.0, 20.0)) == {0}  # 72 % of 720p30's bitrate


def test_a_recovered_target_steps_back_up_one_step_at_a_time() -> None:
    steps = BandwidthSteps(default_bitrate)
    run(steps, 300_000, 0.0, 10.0)
    low = steps.index
    assert low == len(STEPS) - 1
    indices = run(steps, 5_000_000, 10.0, 2 * UP_AFTER_S * len(STEPS) + 5)
    assert indices[-1] == 0
    assert all(b >= a - 1 for a, b in zip(indices, indices[1:], strict=False))  # one at a time
    assert indices.index(low - 1) >= int(UP_AFTER_S / 0.5) - 1  # not at the first good reading


def test_a_target_flapping_at_the_boundary_does_not_flip_the_size() -> None:
    steps = BandwidthSteps(default_bitrate)
    t = 0.0
    changes = 0
    for i in range(60):
        target = 1_000_000 if i % 2 else 2_600_000  # between the down and up thresholds
        if steps.observe(t, target, HD, 30.0) is not None:
            changes += 1
        t += 0.5
    assert changes == 0
