"""The acknowledged bitrate: what got through lately (libwebrtc's RobustThroughputEstimator).

A sliding window of the packets acknowledged last, ordered by arrival: at least
`WINDOW_PACKETS` and at least `MIN_WINDOW_S` of arrivals, at most `MAX_WINDOW_PACKETS` and
`MAX_WINDOW_S`. The rate is min(receive rate, send rate) over the window: the receive rate is
what the bottleneck delivered, and the send rate caps it where a queue bunched the packets
together. The longest gap between arrivals is replaced by the second longest, so that one
stall followed by a burst (a radio link's retransmissions) does not read as a lower rate.

libwebrtc's default is still its Bayesian BitrateEstimator, which smooths 150 ms windows so
much that after a capacity drop from 16 to 2 Mbit/s it reads above 10 Mbit/s for seconds,
and the overuse back-off (to 0.85 × this throughput) barely bites; the robust estimator is
its field-trial replacement (WebRTC-Bwe-RobustThroughputEstimatorSettings). Its window here
is 0.5 s rather than the trial's 1 s default (the trial allows 0.1 to 3 s), for a back-off
that follows a step down within a second.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Final

from .types import PacketResult

WINDOW_PACKETS: Final = 20  # window_packets
MAX_WINDOW_PACKETS: Final = 500  # max_window_packets
MIN_WINDOW_S: Final = 0.5  # window_duration (libwebrtc: 1 s)
MAX_WINDOW_S: Final = 5.0  # max_window_duration: no stale packets after a pause
REQUIRED_PACKETS: Final = 10  # required_packets
MIN_DURATION_S: Final = 0.001


class AcknowledgedBitrate:
    def __init__(self) -> None:
        self._window: deque[PacketResult] = deque()
        self._latest_discarded_send = -math.inf
        self.bitrate: float | None = None  # bits/s; None until REQUIRED_PACKETS arrived

    def update(self, results: Iterable[PacketResult]) -> None:
        """Add received packets (in arrival order, ideally)."""
        window = self._window
        for result in results:
            if window and result.arrival < window[-1].arrival - MAX_WINDOW_S:
                window.clear()  # the arrival clock jumped back: start over
                self._latest_discarded_send = -math.inf
            index = len(window)
            while index > 0 and window[index - 1].arrival > result.arrival:
                index -= 1  # a reordered feedback: keep the window sorted by arrival
            window.insert(index, result)
        while self._first_outside():
            sent = window.popleft().sent
            self._latest_discarded_send = max(self._latest_discarded_send, sent.send_time)
        self.bitrate = self._rate()

    def _first_outside(self) -> bool:
        window = self._window
        if not window:
            return False
        if len(window) > MAX_WINDOW_PACKETS:
            return True
        duration = window[-1].arrival - window[0].arrival
        return duration > MAX_WINDOW_S or (len(window) > WINDOW_PACKETS and duration > MIN_WINDOW_S)

    def _rate(self) -> float | None:
        window = self._window
        if len(window) < REQUIRED_PACKETS:
            return None
        largest = second = 0.0
        previous = window[0].arrival
        for result in window:
            gap = result.arrival - previous
            previous = result.arrival
            if gap > largest:
                largest, second = gap, largest
            elif gap > second:
                second = gap
        first = window[0]
        # the first packet's size arrived before the window's duration began; the last sent
        # packet's size left after the send duration ended
        received = sum(r.sent.size for r in window) - first.sent.size
        duration = window[-1].arrival - first.arrival - largest + second
        receive_rate = received * 8 / max(duration, MIN_DURATION_S)
        # a packet sent before one already discarded was reordered: its send time is no use
        sent = [r.sent for r in window if r.sent.send_time >= self._latest_discarded_send]
        if len(sent) < REQUIRED_PACKETS:
            return receive_rate
        first_send = min(p.send_time for p in sent)
        last = max(sent, key=lambda p: p.send_time)
        send_size = sum(p.size for p in sent) - last.size
        send_rate = send_size * 8 / max(last.send_time - first_send, MIN_DURATION_S)
        return min(send_rate, receive_rate)
