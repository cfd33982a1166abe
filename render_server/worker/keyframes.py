"""Carries the browser's keyframe requests (RTCP PLI/FIR) to the project's encoder.

aiortc 1.16 turns PLI and FIR into `RTCRtpSender._send_keyframe()`, which only sets a flag that
its own encoder reads; on the pre-encoded packet path nothing reads it. We wrap that method on
the one sender instance so that each request also reaches our encoder.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from aiortc import RTCRtpSender


def route_keyframe_requests(sender: RTCRtpSender, on_request: Callable[[], None]) -> None:
    original = getattr(sender, "_send_keyframe", None)
    if not callable(original):
        raise RuntimeError(
            "this aiortc has no RTCRtpSender._send_keyframe; keyframe requests cannot be routed"
        )

    def send_keyframe() -> None:
        on_request()
        original()

    sender._send_keyframe = send_keyframe  # type: ignore[method-assign]


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

    def take(self, now: float) -> bool:
        with self._lock:
            if self._pending and now - self._last >= self.min_interval_s:
                self._pending = False
                self._last = now
                return True
            return False
