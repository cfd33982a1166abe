"""The loss-based bound (libwebrtc's classic SendSideBandwidthEstimation).

Loss is counted over windows of feedback (at least `LIMIT_NUM_PACKETS` packets and
`LOSS_WINDOW_S`; libwebrtc's windows were RTCP receiver reports, about a second apart). Below
2 % loss the bound may rise 8 % a second, from the lowest it was in the last second; between
2 and 10 % it holds (loss of that order is common on radio links and says little about
congestion); above 10 % it falls to rate × (1 - loss / 2), at most once per window and per
300 ms + rtt. The bound never exceeds the delay-based estimate or the max: it is the
delay-based estimate, lowered further by loss. (libwebrtc also keeps it under REMB; here
REMB only caps the target, so that a cap lifted does not leave a bound to climb back.) During
the first 2 s without loss it follows the delay-based estimate directly, so that the start-up
probes take effect at once.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Final

LOW_LOSS: Final = 0.02  # kDefaultLowLossThreshold
HIGH_LOSS: Final = 0.10  # kDefaultHighLossThreshold
INCREASE_FACTOR: Final = 1.08  # over the lowest bound of the last INCREASE_INTERVAL_S
INCREASE_OFFSET: Final = 1000.0  # bits/s, not to get stuck at low rates
INCREASE_INTERVAL_S: Final = 1.0  # kBweIncreaseInterval
DECREASE_INTERVAL_S: Final = 0.3  # kBweDecreaseInterval (+ rtt)
START_PHASE_S: Final = 2.0  # kStartPhase
LIMIT_NUM_PACKETS: Final = 20  # kLimitNumPackets: a window needs this many packets
LOSS_WINDOW_S: Final = 0.5  # ours: transport-cc feedback comes every ~50 ms, not every ~1 s
MAX_FEEDBACK_INTERVAL_S: Final = 5.0  # kMaxRtcpFeedbackInterval: older loss reports are stale


class LossBasedBwe:
    def __init__(self, start: float, min_bitrate: float, max_bitrate: float) -> None:
        self._min = min_bitrate
        self._max = max_bitrate
        self._delay_limit = math.inf
        self.estimate = min(max(start, min_bitrate), max_bitrate)
        self.fraction_loss = 0.0  # of the last complete window
        self._lost = 0
        self._expected = 0
        self._window_start: float | None = None
        self._first_report: float | None = None
        self._last_report: float | None = None
        self._last_decrease: float | None = None
        self._decreased_since_report = False
        self._min_history: deque[tuple[float, float]] = deque()  # (time, bound), increasing
        self.rtt = 0.0
        # loss the sender repairs before the receiver notices (forward error correction):
        # both thresholds move up by it, so that random loss FEC covers holds no rate down
        self.tolerance = 0.0

    def set_bounds(self, min_bitrate: float, max_bitrate: float) -> None:
        self._min, self._max = min_bitrate, max_bitrate
        self._set(self.estimate)

    def set_delay_limit(self, bitrate: float) -> None:
        self._delay_limit = bitrate
        self._set(self.estimate)

    def set_send_bitrate(self, bitrate: float) -> None:
        """A probe measured `bitrate`: jump there, forgetting the increase history (which would
        hold the bound at the lower rates of the last second)."""
        self._delay_limit = math.inf  # the caller sets the new delay-based limit next
        self._set(bitrate)
        self._min_history.clear()

    def on_feedback(self, lost: int, reported: int, now: float) -> None:
        """Count one feedback message's packets; a window that is complete updates the bound."""
        if self._first_report is None:
            self._first_report = now
        if self._window_start is None:
            self._window_start = now
        self._lost = max(self._lost + lost, 0)
        self._expected += reported
        if self._expected < LIMIT_NUM_PACKETS or now - self._window_start < LOSS_WINDOW_S:
            return
        self.fraction_loss = min(self._lost / self._expected, 1.0)
        self._decreased_since_report = False
        self._lost = self._expected = 0
        self._window_start = now
        self._last_report = now
        self.update(now)

    def update(self, now: float) -> None:
        """Apply the last window's loss (also called on the controller's process timer: the
        8 %/s increase is a function of time)."""
        if self.fraction_loss == 0 and self._in_start_phase(now):
            limit = self._delay_limit
            if math.isfinite(limit) and limit != self.estimate:
                self._min_history.clear()
                self._min_history.append((now, self.estimate))
                self._set(limit)
                return
        self._update_min_history(now)
        if self._last_report is None or now - self._last_report >= 1.2 * MAX_FEEDBACK_INTERVAL_S:
            return  # no loss report, or only a stale one: nothing to act on
        loss = max(0.0, self.fraction_loss - self.tolerance)
        if loss <= LOW_LOSS:
            lowest = self._min_history[0][1]
            self._set(lowest * INCREASE_FACTOR + INCREASE_OFFSET)
        elif loss > HIGH_LOSS:
            last = self._last_decrease
            if not self._decreased_since_report and (
                last is None or now - last >= DECREASE_INTERVAL_S + self.rtt
            ):
                self._last_decrease = now
                self._decreased_since_report = True
                self._set(self.estimate * (1 - 0.5 * loss))
        # between the thresholds: hold

    def _in_start_phase(self, now: float) -> bool:
        return self._first_report is None or now - self._first_report < START_PHASE_S

    def _update_min_history(self, now: float) -> None:
        """The lowest bound of the last second, by a monotonic deque."""
        history = self._min_history
        while history and now - history[0][0] + 0.001 > INCREASE_INTERVAL_S:
            history.popleft()
        while history and self.estimate <= history[-1][1]:
            history.pop()
        history.append((now, self.estimate))

    def _set(self, bitrate: float) -> None:
        upper = min(self._delay_limit, self._max)
        self.estimate = max(min(bitrate, upper), self._min)
