"""The delay-gradient detector (libwebrtc's TrendlineEstimator).

Each group delta adds (arrival delta - send delta) to an accumulated queuing delay, smoothed
exponentially; the slope of a least-squares line through the last `WINDOW` smoothed points
estimates (send rate - capacity) / capacity. The slope, scaled, is compared with a threshold
that adapts to the noise: it rises slowly towards large slopes and falls quickly towards
small ones, so a path with a jittery arrival clock needs a clearer trend. Overuse is only
declared once the slope stayed above the threshold for `OVERUSE_TIME_MS` and still grows.
Internally milliseconds, as libwebrtc's constants are.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

from .types import BandwidthUsage

WINDOW: Final = 20  # kDefaultTrendlineWindowSize
SMOOTHING: Final = 0.9  # kDefaultTrendlineSmoothingCoeff
THRESHOLD_GAIN: Final = 4.0  # kDefaultTrendlineThresholdGain
K_UP: Final = 0.0087  # the threshold's adaptation towards larger slopes (per ms)
K_DOWN: Final = 0.039  # ... towards smaller ones
INITIAL_THRESHOLD: Final = 12.5
THRESHOLD_RANGE: Final = (6.0, 600.0)
MAX_ADAPT_OFFSET_MS: Final = 15.0  # kMaxAdaptOffsetMs: a spike this far out does not adapt
MAX_ADAPT_STEP_MS: Final = 100.0  # kMaxTimeDeltaMs
OVERUSE_TIME_MS: Final = 10.0  # kOverUsingTimeThreshold
MIN_NUM_DELTAS: Final = 60  # kMinNumDeltas: the slope's weight grows over the first deltas
DELTA_COUNTER_MAX: Final = 1000  # kDeltaCounterMax


def _slope(points: deque[tuple[float, float]]) -> float | None:
    n = len(points)
    x_avg = sum(x for x, _ in points) / n
    y_avg = sum(y for _, y in points) / n
    numerator = sum((x - x_avg) * (y - y_avg) for x, y in points)
    denominator = sum((x - x_avg) ** 2 for x, _ in points)
    return numerator / denominator if denominator != 0 else None


class TrendlineEstimator:
    def __init__(
        self,
        window: int = WINDOW,
        smoothing: float = SMOOTHING,
        threshold_gain: float = THRESHOLD_GAIN,
    ) -> None:
        self._window = window
        self._smoothing = smoothing
        self._gain = threshold_gain
        self._num_deltas = 0
        self._first_arrival: float | None = None
        self._accumulated = 0.0
        self._smoothed = 0.0
        self._history: deque[tuple[float, float]] = deque(maxlen=window)
        self.threshold = INITIAL_THRESHOLD
        self._last_threshold_update: float | None = None
        self._prev_trend = 0.0
        self._time_over_using = -1.0
        self._overuse_counter = 0
        self.state = BandwidthUsage.NORMAL
        self.modified_trend = 0.0  # the last scaled slope, for logs and tests

    def update(self, arrival_delta: float, send_delta: float, arrival: float) -> BandwidthUsage:
        """One group delta (seconds); `arrival` is the later group's arrival time."""
        arrival_ms = arrival * 1e3
        send_delta_ms = send_delta * 1e3
        delta_ms = arrival_delta * 1e3 - send_delta_ms
        self._num_deltas = min(self._num_deltas + 1, DELTA_COUNTER_MAX)
        if self._first_arrival is None:
            self._first_arrival = arrival_ms
        self._accumulated += delta_ms
        self._smoothed = (
            self._smoothing * self._smoothed + (1 - self._smoothing) * self._accumulated
        )
        self._history.append((arrival_ms - self._first_arrival, self._smoothed))
        trend = self._prev_trend
        if len(self._history) == self._window:
            # 0 < trend < 1: the queue grows; 0: steady; < 0: it drains
            slope = _slope(self._history)
            if slope is not None and math.isfinite(slope):
                trend = slope
        self._detect(trend, send_delta_ms, arrival_ms)
        return self.state

    def _detect(self, trend: float, send_delta_ms: float, now_ms: float) -> None:
        if self._num_deltas < 2:
            self.state = BandwidthUsage.NORMAL
            return
        modified = min(self._num_deltas, MIN_NUM_DELTAS) * trend * self._gain
        self.modified_trend = modified
        if modified > self.threshold:
            if self._time_over_using == -1:
                # assume we have been over-using for half the time since the previous sample
                self._time_over_using = send_delta_ms / 2
            else:
                self._time_over_using += send_delta_ms
            self._overuse_counter += 1
            if (
                self._time_over_using > OVERUSE_TIME_MS
                and self._overuse_counter > 1
                and trend >= self._prev_trend
            ):
                self._time_over_using = 0
                self._overuse_counter = 0
                self.state = BandwidthUsage.OVERUSING
        elif modified < -self.threshold:
            self._time_over_using = -1
            self._overuse_counter = 0
            self.state = BandwidthUsage.UNDERUSING
        else:
            self._time_over_using = -1
            self._overuse_counter = 0
            self.state = BandwidthUsage.NORMAL
        self._prev_trend = trend
        self._update_threshold(modified, now_ms)

    def _update_threshold(self, modified: float, now_ms: float) -> None:
        if self._last_threshold_update is None:
            self._last_threshold_update = now_ms
        if abs(modified) > self.threshold + MAX_ADAPT_OFFSET_MS:
            # a latency spike (e.g. a sudden capacity drop) must not raise the threshold
            self._last_threshold_update = now_ms
            return
        k = K_DOWN if abs(modified) < self.threshold else K_UP
        elapsed = min(max(now_ms - self._last_threshold_update, 0.0), MAX_ADAPT_STEP_MS)
        self.threshold += k * (abs(modified) - self.threshold) * elapsed
        low, high = THRESHOLD_RANGE
        self.threshold = min(max(self.threshold, low), high)
        self._last_threshold_update = now_ms
