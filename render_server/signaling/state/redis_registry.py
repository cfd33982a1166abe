"""The registry shared by several signaling replicas, kept in Redis.

It behaves as `MemoryRegistry` does (the rules are in `registry.py`); what changes is that several
processes act on the same state at once. Every operation that reads and then writes is one Lua
script (`lua/*.lua`), so Redis runs it whole, between any two commands of any replica: two
replicas can never hand one slot to two sessions, and the queue rule (no waiting request fits a
free slot) holds after each script, whoever ran it.

Data model, all keys under `{prefix}:` (the braces put them in one Redis Cluster hash slot):

    workers          hash  worker id -> WorkerInfo as JSON
    slots, used      hash  worker id -> its slots, and how many are claimed (the size of its
                           sessions set, kept beside it: a claim reads one hash, not N sets)
    free             zset  the workers with a free slot, all of score 0: in byte order of id,
                           which is Python's str order (ties of the least-loaded choice)
    order            zset  worker id -> sequence number of its first registration (list order)
    seen             zset  worker id -> server time of its last registration or heartbeat
    load             hash  worker id -> the last heartbeat's load, JSON
    sessions:<id>    zset  session id -> sequence number of its claim (the worker's slots in use)
    holder           hash  session id -> worker id (the index behind `worker_of`)
    queue            zset  session id -> sequence number of its arrival (FIFO)
    wants            hash  session id -> its Requirements as JSON ("" for none: any worker)
    seq              int   the sequence counter
    done:<op>        str   the reply of a recent mutating call, so that a call that redis-py
                           retries after a lost reply answers what it did the first time

Times come from Redis (`TIME`), never from the replicas, so replicas with skewed clocks agree on
expiry; `WorkerStatus.last_seen` is therefore the Redis server's clock.
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.redis import connect_redis, lua_script
from render_server.signaling.state.registry import (
    Claim,
    MemoryRegistry,
    Registry,
    Ticket,
    WorkerInfo,
    WorkerStatus,
    check_requirements,
    check_worker,
)

REPLY_TTL_S = 60  # how long a reply is kept for a retried call (redis-py retries within seconds)

# Every script is fits.lua + common.lua (the keys, the helpers) + the operation's own.
FITS_LUA = lua_script("fits")
COMMON_LUA = FITS_LUA + lua_script("common")


def _claims(flat: list[str]) -> list[Claim]:
    """{session, worker, session, worker, ...} -> claims."""
    return [Claim(flat[i + 1], flat[i]) for i in range(0, len(flat), 2)]


def _info_json(info: WorkerInfo) -> str:
    return json.dumps(
        {
            "worker_id": info.worker_id,
            "slots": info.slots,
            "capabilities": info.capabilities,
            "labels": list(info.labels),
            "region": info.region,
            "replica": info.replica,
        },
        allow_nan=False,
    )


def _info(doc: dict[str, Any]) -> WorkerInfo:
    return WorkerInfo(
        worker_id=doc["worker_id"],
        slots=doc["slots"],
        capabilities=doc["capabilities"],
        labels=tuple(doc["labels"]),
        region=doc["region"],
        replica=doc["replica"],
    )


class RedisRegistry:
    """The registry of several signaling replicas: the same rules as `MemoryRegistry`."""

    def __init__(self, client: aioredis.Redis, prefix: str = "rs") -> None:
        """On a client made with decode_responses=True (see `connect`)."""
        self.prefix = prefix
        self._redis = client
        base = f"{{{prefix}}}:"
        self._keys = [
            base + name
            for name in (
                *("workers", "slots", "used", "free", "order", "seen", "load"),
                *("queue", "wants", "holder", "seq"),
            )
        ]
        self._queue_key, self._holder_key = base + "queue", base + "holder"
        self._done = base + "done:"
        self._sessions = base + "sessions:"

        def script(name: str) -> AsyncScript:
            return self._redis.register_script(COMMON_LUA + lua_script(name))

        self._register = script("register")
        self._heartbeat = script("heartbeat")
        self._unregister = script("unregister")
        self._expire = script("expire")
        self._request = script("request")
        self._cancel = script("cancel")
        self._release = script("release")
        self._workers = script("workers")

    @classmethod
    async def connect(cls, url: str, prefix: str = "rs") -> RedisRegistry:
        """A registry on the Redis at `url`, which has answered (see `connect_redis`)."""
        return cls(await connect_redis(url, "registry", decode_responses=True), prefix)

    async def _call(self, script: AsyncScript, *args: str) -> Any:
        op = uuid.uuid4().hex
        keys = [*self._keys, self._done + op]
        return await script(keys=keys, args=[self._sessions, op, str(REPLY_TTL_S), *args])

    async def register(self, info: WorkerInfo) -> list[Claim]:
        check_worker(info)
        args = (info.worker_id, _info_json(info), str(info.slots))
        return _claims(await self._call(self._register, *args))

    async def heartbeat(self, worker_id: str, load: dict[str, Any]) -> bool:
        return bool(await self._call(self._heartbeat, worker_id, json.dumps(load)))

    async def unregister(self, worker_id: str) -> list[Claim]:
        sessions = await self._call(self._unregister, worker_id)
        return [Claim(worker_id, s) for s in sessions]

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        if math.isnan(timeout_s):
            return {}  # as MemoryRegistry: nothing is older than NaN
        stale = await self._call(self._expire, repr(float(timeout_s)))
        return {w: [Claim(w, s) for s in sessions] for w, sessions in stale}

    async def request(
        self, session_id: str, requirements: Requirements, refuse_unservable: bool = False
    ) -> Ticket:
        check_requirements(requirements)
        wants = "" if requirements == Requirements() else json.dumps(requirements.as_dict())
        refuse = "1" if refuse_unservable else ""
        kind, value = await self._call(self._request, session_id, wants, refuse)
        if kind == "claim":
            return Ticket(session_id, claim=Claim(value, session_id))
        if kind == "unservable":
            return Ticket(session_id, unservable=True)
        return Ticket(session_id, position=int(value))

    async def cancel(self, session_id: str) -> bool:
        (removed,) = await self._call(self._cancel, session_id)
        return bool(removed)

    async def release(self, claim: Claim) -> list[Claim]:
        return _claims(await self._call(self._release, claim.worker_id, claim.session_id))

    async def position(self, session_id: str) -> int | None:
        rank: Any = await self._redis.zrank(self._queue_key, session_id)
        return None if rank is None else int(rank) + 1

    async def queue(self) -> list[str]:
        sessions: Any = await self._redis.zrange(self._queue_key, 0, -1)
        return list(sessions)

    async def worker_of(self, session_id: str) -> str | None:
        worker: Any = await self._redis.hget(self._holder_key, session_id)
        return None if worker is None else str(worker)

    async def workers(self) -> list[WorkerStatus]:
        """Every worker, in registration order; `last_seen` is the Redis server's clock."""
        rows = await self._workers(keys=[*self._keys, self._done], args=[self._sessions, "", "0"])
        return [
            WorkerStatus(_info(json.loads(info)), tuple(sessions), float(seen), json.loads(load))
            for _, info, seen, load, sessions in rows
        ]

    async def close(self) -> None:
        await self._redis.aclose(close_connection_pool=True)


async def connect_registry(url: str | None) -> Registry:
    """The registry for `url`: None -> MemoryRegistry, redis:// or rediss:// -> RedisRegistry."""
    return MemoryRegistry() if url is None else await RedisRegistry.connect(url)
