"""When a worker cannot keep up, a session sends fewer frames instead of later ones.

Frames never queue (the track drops ticks it missed), but a session that misses ticks second
after second shows an uneven picture and starves the worker's other sessions. The governor
watches each second's ticks, dropped ticks and busy time, lowers the session's frame rate in
steps while it is overloaded, and raises it again, one step at a time, once the frames fit with
room to spare.
"""

from __future__ import annotations

from dataclasses import dataclass

STEP = 0.75  # each step down keeps three quarters of the frame rate
MIN_FRACTION = 0.25  # never below a quarter of what the browser asked for
MIN_FPS = 5.0
OVERLOADED_DROP = 0.10  # a second with more than this share of ticks dropped is overloaded
OVERLOADED_SECONDS = 2  # consecutive overloaded seconds before a step down
HEADROOM_BUSY = 0.6  # frames that take under this share of their interval fit with room
HEADROOM_SECONDS = 5  # consecutive roomy seconds before a step up


@dataclass
class SecondOfFrames:
    ticks: int  # frame times in the second (sent, idle or dropped)
    dropped: int
    busy_s: float  # time spent producing frames (render + encode + handoff)
    frames: int


class FrameRateGovernor:
    def __init__(self, wanted_fps: float) -> None:
        self.wanted_fps = wanted_fps
        self.fps = wanted_fps
        self._overloaded = 0
        self._roomy = 0
        self.steps_down = 0

    def want(self, fps: float) -> None:
        """The browser asked for another rate: start from it again."""
        self.wanted_fps = self.fps = fps
        self._overloaded = self._roomy = 0

    def observe(self, second: SecondOfFrames) -> float | None:
        """One second's figures; the new frame rate when it should change, else None."""
        if second.ticks <= 0:
            return None
        dropped = second.dropped / second.ticks
        busy = second.busy_s / second.frames * self.fps if second.frames else 0.0
        if dropped > OVERLOADED_DROP:
            self._overloaded += 1
            self._roomy = 0
        elif busy < HEADROOM_BUSY:
            self._roomy += 1
            self._overloaded = 0
        else:
            self._overloaded = self._roomy = 0
        floor = max(min(MIN_FPS, self.wanted_fps), self.wanted_fps * MIN_FRACTION)
        if self._overloaded >= OVERLOADED_SECONDS and self.fps > floor:
            self._overloaded = 0
            self.steps_down += 1
            self.fps = max(floor, round(self.fps * STEP, 2))
            return self.fps
        if self._roomy >= HEADROOM_SECONDS and self.fps < self.wanted_fps:
            self._roomy = 0
            self.fps = min(self.wanted_fps, round(self.fps / STEP, 2))
            return self.fps
        return None
