"""The round-trip time, from transport-cc feedback alone.

Each feedback message gives a sample: now - the send time of the newest packet it
acknowledges (this includes the receiver's wait before sending feedback, as an RTCP-based
rtt includes its own delays). The mean of the last `WINDOW` samples smooths the jitter
(libwebrtc's GoogCC averages its feedback rtts over kMaxFeedbackRttWindow = 32).
"""

from __future__ import annotations

from collections import deque
from typing import Final

WINDOW: Final = 32  # kMaxFeedbackRttWindow
MAX_SAMPLE_S: Final = 10.0  # a larger sample comes from a clock or a history that is off


class RttEstimator:
    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=WINDOW)

    @property
    def rtt(self) -> float | None:
        return sum(self._samples) / len(self._samples) if self._samples else None

    def add(self, sample: float) -> None:
        if 0 <= sample <= MAX_SAMPLE_S:
            self._samples.append(sample)
