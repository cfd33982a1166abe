"""Which signaling replica a worker tries next, how long it waits, and what it logs about it.

The worker tries its replicas' URLs in turn. After a registered connection drops it tries the
next URL at once; it sleeps only after a whole round of URLs failed, for an exponential backoff
with full jitter (BACKOFF_START_S doubling to BACKOFF_MAX_S), which starts over only once a
replica has registered the worker: a connection that is refused, or dropped before it
registered, does not count as success.

An outage is one WARNING (`worker.signaling_lost`) when it starts and one INFO
(`worker.signaling_restored`, with its seconds) when the worker is registered again; single
failed attempts are DEBUG lines, with a WARNING at most every UNREACHABLE_WARNING_S.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Final

log = logging.getLogger("render_server.worker.agent")

BACKOFF_START_S: Final = 0.5
BACKOFF_MAX_S: Final = 10.0
UNREACHABLE_WARNING_S: Final = 30.0
# a registered connection shorter than this is no proof the replica works: with every replica
# flapping so, the worker still sleeps between rounds instead of spinning
STABLE_S: Final = 1.0

Jitter = Callable[[float], float]  # a backoff's cap → the seconds to sleep


def full_jitter(cap: float) -> float:
    return random.uniform(0.0, cap)


class Backoff:
    def __init__(
        self,
        start_s: float = BACKOFF_START_S,
        max_s: float = BACKOFF_MAX_S,
        jitter: Jitter = full_jitter,
    ) -> None:
        self.start_s = start_s
        self.max_s = max_s
        self.jitter = jitter
        self.failures = 0  # rounds failed since the last registration

    def next(self) -> float:
        """The sleep after one more failed round."""
        cap = min(self.max_s, self.start_s * 2**self.failures)
        self.failures = min(self.failures + 1, 32)
        return float(self.jitter(cap))

    def reset(self) -> None:
        self.failures = 0


class SignalingLinks:
    """The round of URLs, the backoff and the outage's log lines of one worker."""

    def __init__(self, urls: Sequence[str], jitter: Jitter = full_jitter) -> None:
        if not urls:
            raise ValueError("a worker needs at least one signaling URL")
        self.urls = tuple(urls)
        self.backoff = Backoff(jitter=jitter)
        self._next = 0
        self._failed_in_round = 0
        self._outage_since: float | None = None
        self._warned_at = -float("inf")
        self.attempts = 0  # connections tried, in all

    def next_url(self) -> str:
        url = self.urls[self._next]
        self._next = (self._next + 1) % len(self.urls)
        self.attempts += 1
        return url

    def connection_over(self, registered: bool, lasted_s: float) -> float | None:
        """A connection ended; the seconds to sleep before the next, or None: at once."""
        if registered and lasted_s >= STABLE_S:
            self._failed_in_round = 0
            return None
        self._failed_in_round += 1
        if self._failed_in_round < len(self.urls):
            return None
        self._failed_in_round = 0
        return self.backoff.next()

    # -- what is logged ----------------------------------------------------------------------

    def registered(self, url: str, worker_id: str) -> None:
        self.backoff.reset()
        if self._outage_since is None:
            log.info("worker.registered", extra={"worker": worker_id, "url": url})
            return
        seconds = time.monotonic() - self._outage_since
        self._outage_since = None
        log.info(
            "worker.signaling_restored",
            extra={"worker": worker_id, "url": url, "seconds": round(seconds, 1)},
        )

    def lost(self, url: str, code: int | None, reason: str, sessions: int) -> None:
        """A registered connection dropped: an outage starts."""
        now = time.monotonic()
        self._outage_since = now
        self._warned_at = now
        log.warning(
            "worker.signaling_lost",
            extra={"url": url, "code": code, "error": reason[:200], "sessions": sessions},
        )

    def failed(self, url: str, reason: str) -> None:
        """An attempt that did not register the worker."""
        now = time.monotonic()
        if self._outage_since is None:
            self._outage_since = now
        log.debug("worker.connect_failed", extra={"url": url, "error": reason[:200]})
        if now - self._warned_at >= UNREACHABLE_WARNING_S:
            self._warned_at = now
            log.warning(
                "worker.signaling_unreachable",
                extra={
                    "url": url,
                    "error": reason[:200],
                    "attempts": self.attempts,
                    "down_s": round(now - self._outage_since, 1),
                },
            )


__all__ = ["BACKOFF_MAX_S", "BACKOFF_START_S", "Backoff", "SignalingLinks", "full_jitter"]
