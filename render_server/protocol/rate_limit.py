"""A token bucket: a steady rate with room for short bursts."""

from __future__ import annotations


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self._tokens = burst
        self._at: float | None = None

    def take(self, now: float, cost: float = 1.0) -> bool:
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False
