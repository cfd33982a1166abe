"""The application-limited region (libwebrtc's AlrDetector).

A still picture encodes to almost nothing: the sender then uses a fraction of the estimate,
feedback cannot confirm the estimate, and the rate controller may not raise it (its increase
is bounded by the throughput). The detector keeps a budget that fills at 65 % of the estimate
and empties with the bytes sent; a budget fuller than 80 % of its 500 ms window means we are
limited by the application, one below 50 % that we are not any more. In that region the
controller probes periodically, so the estimate is still right when the picture moves.
"""

from __future__ import annotations

from typing import Final

BANDWIDTH_USAGE: Final = 0.65  # kDefaultAlrBandwidthUsagePercent
START_BUDGET_LEVEL: Final = 0.80  # kDefaultAlrStartBudgetLevelPercent
STOP_BUDGET_LEVEL: Final = 0.50  # kDefaultAlrStopBudgetLevelPercent
WINDOW_S: Final = 0.5  # IntervalBudget's kWindowMs


class AlrDetector:
    def __init__(self, estimate: float) -> None:
        self._rate = 0.0  # bytes/s the budget fills at
        self._max_bytes = 0.0
        self._remaining = 0.0  # bytes: positive is unused budget, negative overuse
        self._last_send: float | None = None
        self.start_time: float | None = None  # when the current region began; None: not in one
        self.end_time: float | None = None  # when the last region ended
        self.set_estimate(estimate)

    def set_estimate(self, bitrate: float) -> None:
        self._rate = max(bitrate, 0.0) * BANDWIDTH_USAGE / 8
        self._max_bytes = WINDOW_S * self._rate
        self._remaining = min(max(self._remaining, -self._max_bytes), self._max_bytes)

    def on_bytes_sent(self, size: int, send_time: float) -> None:
        # comparisons rather than min() and max(): this runs for every packet sent
        last = self._last_send
        if last is None:
            self._last_send = send_time
            return  # the time it took to send these bytes is unknown
        elapsed = 0.0
        if send_time > last:
            self._last_send = send_time
            elapsed = send_time - last
        max_bytes = self._max_bytes
        remaining = self._remaining - size
        if remaining < -max_bytes:
            remaining = -max_bytes
        # an underused budget carries over (IntervalBudget with can_build_up_underuse)
        remaining += elapsed * self._rate
        if remaining > max_bytes:
            remaining = max_bytes
        self._remaining = remaining
        level = remaining / max_bytes if max_bytes > 0 else 0.0
        if level > START_BUDGET_LEVEL and self.start_time is None:
            self.start_time = send_time
        elif level < STOP_BUDGET_LEVEL and self.start_time is not None:
            self.start_time = None
            self.end_time = send_time
