"""The audit log: one line per security-relevant event (logger `render_server.audit`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from render_server.protocol.rate_limit import TokenBucket

audit_log = logging.getLogger("render_server.audit")


def audit(event: str, **fields: Any) -> None:
    """Session start/end, refusals, rate limits, forged or lost workers: `event` and its facts."""
    audit_log.info(event, extra=fields)


class Throttled:
    """A log line an attacker can provoke at will, kept to a rate so that the log cannot be
    filled: bursts of `burst` lines, then `rate_per_s`; the lines left out are counted on the
    next one written (`suppressed=N`)."""

    def __init__(
        self,
        logger: logging.Logger = audit_log,
        level: int = logging.INFO,
        rate_per_s: float = 1.0,
        burst: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._level = level
        self._bucket = TokenBucket(rate_per_s, burst)
        self._clock = clock
        self.suppressed = 0

    def __call__(self, event: str, **fields: Any) -> None:
        if not self._bucket.take(self._clock()):
            self.suppressed += 1
            return
        if self.suppressed:
            fields["suppressed"] = self.suppressed
            self.suppressed = 0
        self._logger.log(self._level, event, extra=fields)


# refusals a caller can provoke at will (a bad token, a foreign Origin, one session too many):
# one shared budget, so that no kind of refusal can fill the log
audit_refusal = Throttled(rate_per_s=5.0, burst=50.0)
