"""Connecting to Redis: one check of the URL and of Redis answering, one way to say it failed.

Clients wait for a free connection under a burst instead of failing: redis-py's default pool
refuses the 101st concurrent command ("Too many connections"), and a thousand browsers asking
for sessions at once would get internal errors. A blocking pool queues them on a bounded number
of connections instead.

Redis may go away for a while (a restart, a failover, a stalled host). A command whose
connection fails (`ConnectionError`: reset, closed, refused) is retried on a fresh connection,
with exponential backoff and jitter: after a restart every pooled connection is stale, and its
next command would fail once; the retry hides that, and rides out a restart of well under a
second. A Redis that does not answer (paused, stalled, a dropped network) fails a command with
`TimeoutError` after one socket timeout, not retried: redis-py retries a connection's handshake
inside a command's retry, and retried timeouts multiplied to 10 s and more for one call. Callers
thus fail within seconds instead of hanging. A command retried must be safe to send twice:
reads, PUBLISH (delivery is at most once anyway), and the registry's and session store's
scripts (idempotent, or keeping their reply under a call id).
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

MAX_CONNECTIONS = 64
WAIT_S = 20.0
SCHEMES = ("redis", "rediss")
# A stale connection fails at once and its retry succeeds; a Redis that refuses connections fails
# a command after the retries (under a second of backoff in all); one that accepts and does not
# answer, after one socket timeout.
RETRIES = 3
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 1.0
SOCKET_TIMEOUT_S = 2.0  # a command's reply (Redis answers in well under a millisecond)
CONNECT_TIMEOUT_S = 2.0
HEALTH_CHECK_S = 10  # an idle pooled connection is PINGed before reuse after this long
LUA_DIR = "lua"  # next to this module, shipped as package data (pyproject.toml)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))


def check_url(url: str, what: str) -> None:
    """ValueError unless `url` is a redis:// or rediss:// URL; `what` names its use."""
    if urlsplit(url).scheme not in SCHEMES:
        raise ValueError(f"{what} URL must start with redis:// or rediss://, not {redact(url)!r}")


def retry_policy(retries: int = RETRIES) -> Retry:
    """Retries of a command on a failed connection, with jittered backoff (not on a timeout:
    see the module's docstring)."""
    backoff = ExponentialWithJitterBackoff(base=BACKOFF_BASE_S, cap=BACKOFF_CAP_S)
    return Retry(backoff, retries, supported_errors=(RedisConnectionError,))


def redis_client(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client on a blocking pool (not connected yet), with retries and socket timeouts;
    keyword arguments override those of the connections."""
    options: dict[str, Any] = {
        "retry": retry_policy(),
        "socket_timeout": SOCKET_TIMEOUT_S,
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "health_check_interval": HEALTH_CHECK_S,
    }
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=WAIT_S, **(options | kwargs)
    )
    return aioredis.Redis(connection_pool=pool)


async def connect_redis(url: str, what: str, **kwargs: Any) -> aioredis.Redis:
    """A client of the Redis at `url` that has answered a PING.

    ValueError for a URL that is not Redis's, ConnectionError (password redacted) when nobody
    answers: the operator reads either as one line at start.
    """
    check_url(url, what)
    client = redis_client(url, **kwargs)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose(close_connection_pool=True)
        raise ConnectionError(f"no Redis answers at {redact(url)} ({what}): {exc}") from exc
    return client


def lua_script(name: str) -> str:
    """The text of the Lua script `lua/{name}.lua`."""
    folder = resources.files(__name__.rpartition(".")[0]).joinpath(LUA_DIR)
    return folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
