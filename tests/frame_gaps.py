"""Freezes on the screen, from a page's video frame callbacks (`requestVideoFrameCallback`).

A page's callbacks are not the screen. Headless Chromium on a busy machine runs the page's
rendering steps less often than the compositor puts frames up: one callback then stands for
several frames presented, and the gap between two callbacks looks like a freeze that nobody
saw. The callback's `presentedFrames` says how many frames the compositor took since the last
callback (the spec gives it for exactly this), and `getVideoPlaybackQuality().droppedVideoFrames`
how many of those it replaced before drawing them (read in Chromium's
WebMediaPlayerMSCompositor: `presentedFrames` counts every frame made current, `dropped` each
one replaced before it was put on screen). Frames drawn between two callbacks each took a
vsync of their own, so with `k` drawn in a gap of `g` ms the longest still picture in it was at
most `g - (k - 1) * vsync`: a freeze is counted where that bound exceeds three frame intervals.
The bound never hides a freeze that happened; it may keep one that did not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

FRAME_INTERVAL_MS = 1000 / 30
VSYNC_MS = 1000 / 60  # headless Chromium's BeginFrame interval
# callback times fall on vsyncs: a gap of exactly three intervals (six vsyncs) is not over
# three, whatever the last bits of the floating-point times say
TOLERANCE_MS = 0.5


def longest_still(
    gap_ms: float, presented_step: int | None, dropped_step: int | None, vsync_ms: float
) -> float:
    """The most a picture can have stayed on the screen within one gap of `gap_ms` between two
    callbacks, `presented_step` frames presented and `dropped_step` of them never drawn."""
    if presented_step is None:
        return gap_ms
    drawn = presented_step - (dropped_step or 0)
    return gap_ms - max(drawn - 1, 0) * vsync_ms


def gaps(
    shown: Sequence[float],
    sent: Sequence[Sequence[float | None]] | None = None,
    records: Sequence[int] | None = None,
    presented: Sequence[int] | None = None,
    dropped: Sequence[int] | None = None,
    interval_ms: float = FRAME_INTERVAL_MS,
) -> dict[str, Any]:
    """Freezes in a drag window: gaps whose longest still picture (`longest_still`) exceeds
    three frame intervals; the gaps between callbacks alone (`callback_freezes`, what a page
    without `presentedFrames` would call freezes) beside them. With each shown frame's RTP
    timestamp and receive time (`sent`) and the RTP timestamps of the frames the worker sent
    (`records`), what each freeze came with: the two shown frames' capture times as far apart
    as the freeze and no frame sent between (the worker's frame clock skipped on this busy
    machine: "worker"); else their last packets arrived as far apart ("path": late or lost on
    the way); else both came in time ("display": the browser held them, or waited for a frame
    between them that came late, as H.264's receiver holds every frame after a lost packet)."""
    steps = [b - a for a, b in zip(shown, shown[1:], strict=False)]
    drawn, unseen = _per_gap(presented, shown), _per_gap(dropped, shown)
    vsync = min([VSYNC_MS, *(s for s in steps if s > 0)])  # never over the page's shortest step
    still = [
        longest_still(g, drawn[i] if drawn else None, unseen[i] if unseen else None, vsync)
        for i, g in enumerate(steps)
    ]
    limit = 3 * interval_ms + TOLERANCE_MS
    freezes = [i for i, g in enumerate(still) if g > limit]
    causes = {"worker": 0, "path": 0, "display": 0}
    known = sent is not None and records is not None and len(sent) == len(shown)
    if known:
        assert sent is not None and records is not None
        for i in freezes:
            (rtp_a, got_a), (rtp_b, got_b) = sent[i], sent[i + 1]
            if rtp_a is None or rtp_b is None or got_a is None or got_b is None:
                causes["display"] += 1
                continue
            span = (int(rtp_b) - int(rtp_a)) % 2**32
            between = any(0 < (r - int(rtp_a)) % 2**32 < span for r in records)
            if not between and span / 90 > 2.5 * interval_ms:
                causes["worker"] += 1
            elif got_b - got_a > 2.5 * interval_ms:
                causes["path"] += 1
            else:
                causes["display"] += 1
    return {
        "longest_gap_ms": max(still, default=0.0),
        "longest_callback_gap_ms": max(steps, default=0.0),
        "freezes": len(freezes),
        "freezes_over_200ms": sum(1 for i in freezes if still[i] > 200 + TOLERANCE_MS),
        "callback_freezes": sum(1 for g in steps if g > limit),
        "freezes_by_cause": causes if known else None,
    }


def displayed_frames(
    shown: Sequence[float], presented: Sequence[int] | None, dropped: Sequence[int] | None
) -> int:
    """Frames drawn from the window's first callback to its last: the compositor's count where
    the page kept it, else the callbacks'."""
    drawn, unseen = _per_gap(presented, shown), _per_gap(dropped, shown)
    if drawn is None:
        return len(shown)
    return 1 + sum(drawn) - (sum(unseen) if unseen is not None else 0)


def _per_gap(counts: Sequence[int] | None, shown: Sequence[float]) -> list[int] | None:
    """How far a compositor count kept at each callback moved in each gap between callbacks;
    None where the page kept none, or not one for each callback."""
    if not counts or len(counts) != len(shown):
        return None
    return [b - a for a, b in zip(counts, counts[1:], strict=False)]
