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

import itertools
import math
import operator
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
    """The window is kept as three parallel deques of numbers (arrival, size, send time), so
    that the rate after each feedback is a few passes in C (sum, min, max, a sort of the gaps)
    rather than Python loops over up to 500 packets: at 4K60 under transport-cc this window was
    a tenth of the worker's event loop."""

    def __init__(self) -> None:
        self._arrivals: deque[float] = deque()
        self._sizes: deque[int] = deque()
        self._sends: deque[float] = deque()
        self._latest_discarded_send = -math.inf
        self.bitrate: float | None = None  # bits/s; None until REQUIRED_PACKETS arrived

    def update(self, results: Iterable[PacketResult]) -> None:
        """Add received packets (in arrival order, ideally)."""
        arrivals, sizes, sends = self._arrivals, self._sizes, self._sends
        for result in results:
            arrival = result.arrival
            if arrivals and arrival < arrivals[-1] - MAX_WINDOW_S:
                arrivals.clear()  # the arrival clock jumped back: start over
                sizes.clear()
                sends.clear()
                self._latest_discarded_send = -math.inf
            if not arrivals or arrival >= arrivals[-1]:
                arrivals.append(arrival)
                sizes.append(result.sent.size)
                sends.append(result.sent.send_time)
                continue
            index = len(arrivals)
            while index > 0 and arrivals[index - 1] > arrival:
                index -= 1  # a reordered feedback: keep the window sorted by arrival
            arrivals.insert(index, arrival)
            sizes.insert(index, result.sent.size)
            sends.insert(index, result.sent.send_time)
        if arrivals:  # the oldest out while it is outside the window (a pop per packet, inlined)
            latest, discarded = arrivals[-1], self._latest_discarded_send
            count = len(arrivals)
            while count > MAX_WINDOW_PACKETS or (
                (duration := latest - arrivals[0]) > MAX_WINDOW_S
                or (count > WINDOW_PACKETS and duration > MIN_WINDOW_S)
            ):
                arrivals.popleft()
                sizes.popleft()
                send = sends.popleft()
                if send > discarded:
                    discarded = send
                count -= 1
            self._latest_discarded_send = discarded
        self.bitrate = self._rate()

    def _rate(self) -> float | None:
        arrivals, sizes, sends = self._arrivals, self._sizes, self._sends
        if len(arrivals) < REQUIRED_PACKETS:
            return None
        gaps: list[float] = sorted(map(operator.sub, itertools.islice(arrivals, 1, None), arrivals))
        largest, second = gaps[-1], gaps[-2]
        # the first packet's size arrived before the window's duration began; the last sent
        # packet's size left after the send duration ended
        total = sum(sizes)
        received = total - sizes[0]
        duration = arrivals[-1] - arrivals[0] - largest + second
        receive_rate = received * 8 / max(duration, MIN_DURATION_S)
        first_send = min(sends)
        if first_send >= self._latest_discarded_send:  # no packet reordered past the window
            last_send = max(sends)
            send_size = total - sizes[sends.index(last_send)]
        else:  # a packet sent before one already discarded was reordered: its time is no use
            kept = [(t, n) for t, n in zip(sends, sizes, strict=True)
                    if t >= self._latest_discarded_send]  # fmt: skip
            if len(kept) < REQUIRED_PACKETS:
                return receive_rate
            first_send = min(t for t, _ in kept)
            last_send, last_size = max(kept, key=lambda p: p[0])
            send_size = sum(n for _, n in kept) - last_size
        send_rate = send_size * 8 / max(last_send - first_send, MIN_DURATION_S)
        return min(send_rate, receive_rate)
