"""Which failures are an outage of the shared state (Redis away, paused, restarting), as opposed
to a bug: an outage is ridden out (logged once, answered `unavailable`, retried later), a bug
is logged with its traceback."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

OUTAGE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,  # BusyLoadingError too: a Redis that restarts is loading its data
    RedisTimeoutError,
    ConnectionError,
    TimeoutError,
)


def is_outage(exc: BaseException) -> bool:
    return isinstance(exc, OUTAGE_ERRORS)
