"""When the path carries too little for the stream, send fewer pixels, then fewer frames.

An encoder squeezed far below the bitrate its size and rate need makes a blurred, blocky
picture at full size; a designer reads a smaller sharp one better (libwebrtc's "balanced"
degradation does the same). The steps scale the size the page asked for first, then the frame
rate. A step down needs the congestion controller's target to stay under `DOWN_SHARE` of what
the current step's size and rate are given for `DOWN_AFTER_S`; a step back up needs the target
to reach `UP_SHARE` of the larger step's bitrate for `UP_AFTER_S`, so that a target hovering
at a boundary does not flip the size (each change costs a keyframe).

Sans-IO: `observe` is called about once a second with the time and the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from render_server.config import Resolution
from render_server.stream.quality import MIN_HEIGHT, MIN_WIDTH

DOWN_SHARE: Final = 0.5
DOWN_AFTER_S: Final = 1.5
UP_SHARE: Final = 0.8
UP_AFTER_S: Final = 2.5


@dataclass(frozen=True)
class Step:
    scale: float  # of each side of the size asked for
    frame_share: float  # of the frame rate asked for

    def apply(self, resolution: Resolution, fps: float) -> tuple[Resolution, float]:
        """The size (even sides) and frame rate this step sends of `resolution` at `fps`."""
        if self.scale >= 1.0 and self.frame_share >= 1.0:
            return resolution, fps
        width = max(MIN_WIDTH, int(resolution.width * self.scale) // 2 * 2)
        height = max(MIN_HEIGHT, int(resolution.height * self.scale) // 2 * 2)
        return Resolution(width, height), max(1.0, round(fps * self.frame_share, 2))

    def describe(self) -> str:
        return f"{self.scale:.0%} size, {self.frame_share:.0%} frames"


FULL: Final = Step(1.0, 1.0)
STEPS: Final = (FULL, Step(0.75, 1.0), Step(0.5, 1.0), Step(0.5, 2 / 3), Step(0.5, 0.5))


class BandwidthSteps:
    """Which step of `STEPS` a session's stream is at, from the controller's target.

    `bitrate_for(resolution, fps)` is what the worker gives a stream of that size and rate
    (`StreamConfig.bitrate_for`); the steps ask it of the page's size and rate, scaled.
    """

    def __init__(self, bitrate_for: Callable[[Resolution, float], int]) -> None:
        self._bitrate_for = bitrate_for
        self.index = 0
        self._low_since: float | None = None
        self._high_since: float | None = None

    @property
    def step(self) -> Step:
        return STEPS[self.index]

    def reset(self) -> None:
        self.index = 0
        self._low_since = self._high_since = None

    def observe(self, now: float, target: int, resolution: Resolution, fps: float) -> Step | None:
        """The target at `now`, for a stream asked at `resolution` and `fps`; the new step
        when it changes, else None."""
        need = self._bitrate_for(*self.step.apply(resolution, fps))
        if target < DOWN_SHARE * need and self.index < len(STEPS) - 1:
            self._high_since = None
            self._low_since = now if self._low_since is None else self._low_since
            if now - self._low_since >= DOWN_AFTER_S:
                self.index += 1
                self._low_since = None
                return self.step
            return None
        self._low_since = None
        if self.index > 0:
            larger = STEPS[self.index - 1]
            if target >= UP_SHARE * self._bitrate_for(*larger.apply(resolution, fps)):
                self._high_since = now if self._high_since is None else self._high_since
                if now - self._high_since >= UP_AFTER_S:
                    self.index -= 1
                    self._high_since = None
                    return self.step
                return None
        self._high_since = None
        return None
