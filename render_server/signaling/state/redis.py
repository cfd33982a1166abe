"""Redis clients that wait for a free connection under a burst instead of failing.

redis-py's default pool refuses the 101st concurrent command ("Too many connections"): a
thousand browsers asking for sessions at once would get internal errors. A blocking pool
queues them on a bounded number of connections instead.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

MAX_CONNECTIONS = 64
WAIT_S = 20.0


def redis_client(url: str, **kwargs: Any) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=WAIT_S, **kwargs
    )
    return aioredis.Redis(connection_pool=pool)
