"""The frame-rate governor: fewer frames when the worker cannot keep up, back up when it can."""

from __future__ import annotations

from render_server.stream.governor import FrameRateGovernor, SecondOfFrames


def overloaded(fps: float) -> SecondOfFrames:
    ticks = round(fps)
    return SecondOfFrames(ticks=ticks, dropped=ticks // 3, busy_s=1.0, frames=ticks - ticks // 3)


def roomy(fps: float) -> SecondOfFrames:
    frames = round(fps)
    return SecondOfFrames(ticks=frames, dropped=0, busy_s=frames * 0.1 / fps, frames=frames)


def test_steps_down_after_two_overloaded_seconds_and_never_below_a_quarter() -> None:
    governor = FrameRateGovernor(60.0)
    assert governor.observe(overloaded(60)) is None  # one bad second is no trend
    assert governor.observe(overloaded(60)) == 45.0
    rates = [governor.fps]
    for _ in range(40):
        if (fps := governor.observe(overloaded(governor.fps))) is not None:
            rates.append(fps)
    assert rates == sorted(rates, reverse=True)
    assert governor.fps == 15.0 and governor.steps_down == len(rates)


def test_climbs_back_one_step_per_five_roomy_seconds_up_to_the_wanted_rate() -> None:
    governor = FrameRateGovernor(30.0)
    for _ in range(4):
        governor.observe(overloaded(governor.fps))
    low = governor.fps
    assert low < 30.0
    changes = [governor.observe(roomy(governor.fps)) for _ in range(60)]
    ups = [c for c in changes if c is not None]
    assert ups[0] > low and ups[-1] == 30.0 and governor.fps == 30.0
    assert changes.index(ups[0]) == 4  # the fifth roomy second


def test_busy_but_not_dropping_holds_the_rate_and_a_new_request_resets() -> None:
    governor = FrameRateGovernor(30.0)
    busy = SecondOfFrames(ticks=30, dropped=1, busy_s=0.8, frames=29)
    assert all(governor.observe(busy) is None for _ in range(20))
    governor.observe(overloaded(30))
    governor.observe(overloaded(30))
    assert governor.fps < 30
    governor.want(20.0)
    assert governor.fps == 20.0 and governor.observe(roomy(20)) is None
