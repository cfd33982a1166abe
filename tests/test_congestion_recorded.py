"""The congestion controller replayed on a real session: Chromium's transport feedback and the
packets the worker sent while the lab's link stepped 20 → 2 → 20 Mbit/s (recorded by
tests/record_congestion.py). Sans-IO: the recorded inputs go into a fresh controller, its
targets come out, and must do what the issue asks of the live stream."""

from __future__ import annotations

import json
from pathlib import Path

from render_server.transport.congestion.record import (
    controller_from_header,
    open_recording,
    replay,
)
from render_server.transport.send_path import ESTIMATE_HEADROOM

DATA = Path(__file__).parent / "data" / "congestion"
NAME = "chromium-step-20-2-20"


def load() -> tuple[list[tuple[float, int]], dict[str, float]]:
    """(time, the encoder's target) after each feedback and timer, and the step times. The
    encoder's target is the controller's within the stream's most (the controller may
    estimate ESTIMATE_HEADROOM times more, for the pacer), as the send path computes it."""
    meta = json.loads((DATA / f"{NAME}.json").read_text())
    with open_recording(DATA / f"{NAME}.jsonl.gz") as file:
        lines = file.read().splitlines()
    controller = controller_from_header(lines[0])
    most = controller.max_bitrate // ESTIMATE_HEADROOM
    targets = replay(lines, controller)
    return [(t, min(bps, most)) for t, bps in targets], meta


def test_the_replayed_target_falls_under_the_new_rate_within_two_seconds() -> None:
    targets, meta = load()
    down, up = meta["step_down"], meta["step_up"]
    before = [bps for t, bps in targets if down - 2 <= t < down]
    assert min(before) > 2_000_000  # the link carried more, and the target had it
    under = next(t for t, bps in targets if t >= down and bps < 2_000_000)
    print(f"under 2 Mbit/s {under - down:.2f} s after the step down")
    assert under - down <= 2.0
    # and it stays within the link while the link is low (after the first second's fall)
    low = [bps for t, bps in targets if down + 3 <= t < up]
    assert max(low) <= 2_400_000, max(low)


def test_the_replayed_target_climbs_back_within_ten_seconds_of_the_step_up() -> None:
    targets, meta = load()
    down, up = meta["step_down"], meta["step_up"]
    before = max(bps for t, bps in targets if t < down)
    back = next((t for t, bps in targets if t >= up and bps >= 0.9 * before), None)
    assert back is not None, "the target never came back"
    print(f"back to 90 % of {before / 1e6:.1f} Mbit/s {back - up:.2f} s after the step up")
    assert back - up <= 10.0


def test_a_replay_is_deterministic() -> None:
    first, _ = load()
    second, _ = load()
    assert first == second and len(first) > 200
