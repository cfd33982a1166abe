"""Freezes counted from frame callbacks and the compositor's counts (tests/frame_gaps.py)."""

from __future__ import annotations

import pytest

from tests.frame_gaps import VSYNC_MS, displayed_frames, gaps, longest_still

V = VSYNC_MS


def times(*vsyncs: int) -> list[float]:
    """Callback times, each the given number of vsyncs after the one before."""
    out = [1000.0]
    for n in vsyncs:
        out.append(out[-1] + n * V)
    return out


def counts(*steps: int) -> list[int]:
    out = [100]
    for n in steps:
        out.append(out[-1] + n)
    return out


def test_a_gap_of_three_intervals_is_not_over_three() -> None:
    shown = times(2, 6, 2)  # 33, 100, 33 ms: two frames missing, not a freeze
    result = gaps(shown)
    assert result["freezes"] == 0 and result["callback_freezes"] == 0
    assert result["longest_gap_ms"] == pytest.approx(100)


def test_a_gap_over_three_intervals_with_one_frame_drawn_is_a_freeze() -> None:
    shown = times(2, 7, 2)
    result = gaps(shown, presented=counts(1, 1, 1), dropped=counts(0, 0, 0))
    assert result["freezes"] == 1 and result["callback_freezes"] == 1
    assert result["longest_gap_ms"] == pytest.approx(7 * V)


def test_a_frame_drawn_between_two_callbacks_splits_the_gap() -> None:
    """The page missed a callback: the compositor drew two frames in 117 ms, so no picture
    stayed more than 100 ms."""
    shown = times(2, 7, 2)
    result = gaps(shown, presented=counts(1, 2, 1), dropped=counts(0, 0, 0))
    assert result["freezes"] == 0 and result["callback_freezes"] == 1
    assert result["longest_gap_ms"] == pytest.approx(6 * V)
    assert result["longest_callback_gap_ms"] == pytest.approx(7 * V)


def test_a_frame_replaced_before_it_was_drawn_does_not_split_it() -> None:
    shown = times(2, 7, 2)
    result = gaps(shown, presented=counts(1, 2, 1), dropped=counts(0, 1, 0))
    assert result["freezes"] == 1


def test_long_freezes_stay_long_after_the_split() -> None:
    shown = times(2, 16, 2)  # 267 ms, two frames drawn in it: still one picture up 250 ms
    result = gaps(shown, presented=counts(1, 2, 1), dropped=counts(0, 0, 0))
    assert result["freezes"] == 1 and result["freezes_over_200ms"] == 1
    assert longest_still(16 * V, 2, 0, V) == pytest.approx(15 * V)


def test_the_vsync_is_never_taken_longer_than_the_pages_shortest_step() -> None:
    """A page whose callbacks come 10 ms apart somewhere refreshes faster than 60 Hz: each
    drawn frame then takes no more than 10 ms off the bound."""
    shown = [0.0, 10.0, 43.3, 160.0]
    result = gaps(shown, presented=counts(1, 1, 2), dropped=counts(0, 0, 0))
    assert result["longest_gap_ms"] == pytest.approx(116.7 - 10)
    assert result["freezes"] == 1


def test_counts_that_do_not_line_up_with_the_callbacks_are_not_used() -> None:
    shown = times(2, 7, 2)
    result = gaps(shown, presented=[1, 2, 3])  # one short
    assert result["freezes"] == 1
    assert displayed_frames(shown, [1, 2, 3], None) == len(shown)


def test_what_each_freeze_came_with() -> None:
    shown = times(2, 8, 2, 8, 2, 8)  # freezes between frames 1-2, 3-4 and 5-6
    # 1-2: the worker sent nothing between them; 3-4: it sent two, and the shown ones' last
    # packets came 200 ms apart (the path); 5-6: it sent one, both came in time (the browser)
    sent = [[0, 0.0], [3000, 33.0], [15000, 166.0], [18000, 200.0], [27000, 400.0],
            [30000, 433.0], [36000, 466.0]]  # fmt: skip
    records = [0, 3000, 15000, 18000, 21000, 24000, 27000, 30000, 33000, 36000]
    result = gaps(shown, sent, records, counts(1, 1, 1, 1, 1, 1), counts(0, 0, 0, 0, 0, 0))
    assert result["freezes"] == 3
    assert result["freezes_by_cause"] == {"worker": 1, "path": 1, "display": 1}
    # the next frame, sent on time but arriving late, is the path's, not the worker's
    late = [[0, 0.0], [3000, 33.0], [6000, 166.0]]
    result = gaps(times(2, 8), late, [0, 3000, 6000], counts(1, 1), counts(0, 0))
    assert result["freezes_by_cause"] == {"worker": 0, "path": 1, "display": 0}


def test_displayed_frames_are_the_compositors_less_those_it_dropped() -> None:
    shown = times(2, 4, 2)
    assert displayed_frames(shown, counts(1, 2, 1), counts(0, 1, 0)) == 1 + 4 - 1
    assert displayed_frames(shown, counts(1, 2, 1), None) == 5
    assert displayed_frames(shown, None, None) == 4
