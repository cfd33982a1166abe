"""Connecting to Redis: one check of the URL and of Redis answering, one way to say it failed.

Clients wait for a free connection under a burst instead of failing: redis-py's default pool
refuses the 101st concurrent command ("Too many connections"), and a thousand browsers asking
for sessions at once would get internal errors. A blocking pool queues them on a bounded number
of connections instead.
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

MAX_CONNECTIONS = 64
WAIT_S = 20.0
SCHEMES = ("redis", "rediss")
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


def redis_client(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client on a blocking pool (not connected yet)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=WAIT_S, **kwargs
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
