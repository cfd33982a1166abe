"""Keyframe requests, rate limited: one client's storm of PLIs cannot flood the encoder."""

from __future__ import annotations

import threading


class KeyframeGate:
    """Keyframe requests (PLI/FIR, start) at most once per interval; none is ever lost.

    A request inside the interval waits for it to pass, so a storm of requests from one client
    costs one IDR per interval instead of one per request.
    """

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self._pending = True  # the first frame is always a keyframe
        self._last = -float("inf")
        self._lock = threading.Lock()
        self.requests = 0

    def request(self) -> None:
        with self._lock:
            self._pending = True
            self.requests += 1

    @property
    def pending(self) -> bool:
        return self._pending

    def take(self, now: float) -> bool:
        with self._lock:
            if self._pending and now - self._last >= self.min_interval_s:
                self._pending = False
                self._last = now
                return True
            return False
