"""The registry shared by several signaling replicas, kept in Redis.

It behaves as `MemoryRegistry` does (the rules are in `registry.py`); what changes is that several
processes act on the same state at once. Every operation that reads and then writes is one Lua
script (`lua/*.lua`), so Redis runs it whole, between any two commands of any replica: two
replicas can never hand one slot to two sessions, and the queue rule (no waiting request fits a
free slot) holds after each script, whoever ran it.

Data model, all keys under `{prefix}:` (the braces put them in one Redis Cluster hash slot):

    workers          hash  worker id -> WorkerInfo as JSON (its `draining` is the set's, below)
    slots, used      hash  worker id -> its slots, and how many are claimed (the size of its
                           sessions set, kept beside it: a claim reads one hash, not N sets)
    free             zset  the non-draining workers with a free slot, all of score 0: in byte
                           order of id, which is Python's str order (ties of the least-loaded
                           choice)
    draining         set   the workers that take no new claim
    order            zset  worker id -> sequence number of its first registration (list order)
    seen             zset  worker id -> server time of its last registration or heartbeat
    load             hash  worker id -> the last heartbeat's load, JSON
    sessions:<id>    zset  session id -> sequence number of its claim (the worker's slots in use)
    claimed:<id>     hash  session id -> when the worker's claim was made (µs)
    holder           hash  session id -> the worker of its newest claim (behind `worker_of`)
    moved            hash  session id -> JSON list of the other workers whose sets still hold it
                           (it moves away from them; absent for nearly every session)
    queue            zset  session id -> its score: arrival time in µs, or a score given back,
                           or for a move off a draining worker its time - 10^15 (ahead of all)
    parked           zset  session id -> its queue score, kept while its browser is away
    wants            hash  session id -> its Requirements as JSON ("" for none: any worker), for
                           every waiting or claimed session (a move needs them)
    owner            hash  session id -> the replica that owns its claim or entry
    lease            zset  session id -> when its lease ends (µs); a session is known (a claim,
                           a queue or park entry) exactly while it has one
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
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.redis import connect_redis, lua_script
from render_server.signaling.state.registry import (
    Claim,
    DrainResult,
    HeartbeatResult,
    LeaseExpiry,
    MemoryRegistry,
    RegisterResult,
    Registry,
    Ticket,
    Withdrawn,
    WorkerInfo,
    WorkerStatus,
    check_requirements,
    check_worker,
)
from render_server.signaling.state.registry_types import check_ids, check_score, micros

REPLY_TTL_S = 60  # how long a reply is kept for a retried call (redis-py retries within seconds)
KEYS = (
    *("workers", "slots", "used", "free", "order", "seen", "load", "queue"),
    *("wants", "holder", "seq", "parked", "owner", "lease", "moved", "draining"),
)  # common.lua names them in this order

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
            "draining": info.draining,
            "instance": info.instance,
        },
        allow_nan=False,
    )


def _info(doc: dict[str, Any], draining: bool) -> WorkerInfo:
    return WorkerInfo(
        worker_id=doc["worker_id"],
        slots=doc["slots"],
        capabilities=doc["capabilities"],
        labels=tuple(doc["labels"]),
        region=doc["region"],
        replica=doc["replica"],
        draining=draining,
        instance=doc.get("instance", ""),
    )


def _ticket(session_id: str, reply: list[Any]) -> Ticket:
    """A ticket from {'claim', worker} | {'queued', position, score} | {'parked', score} |
    {'unservable'} | {'none'}."""
    kind = reply[0]
    if kind == "claim":
        return Ticket(session_id, claim=Claim(reply[1], session_id))
    if kind == "queued":
        return Ticket(session_id, position=int(reply[1]), queued_at=int(reply[2]))
    if kind == "parked":
        return Ticket(session_id, queued_at=int(reply[1]))
    return Ticket(session_id, unservable=kind == "unservable")


class RedisRegistry:
    """The registry of several signaling replicas: the same rules as `MemoryRegistry`."""

    def __init__(self, client: aioredis.Redis, prefix: str = "rs") -> None:
        """On a client made with decode_responses=True (see `connect`)."""
        self.prefix = prefix
        self._redis = client
        self._base = base = f"{{{prefix}}}:"
        self._keys = [base + name for name in KEYS]
        self._queue_key, self._holder_key = base + "queue", base + "holder"
        self._owner_key = base + "owner"
        self._done = base + "done:"

        def script(name: str) -> AsyncScript:
            return self._redis.register_script(COMMON_LUA + lua_script(name))

        self._scripts = {
            name: script(name)
            for name in (
                *("register", "heartbeat", "unregister", "expire", "request", "renew"),
                *("expire_leases", "cancel", "withdraw", "park", "unpark", "release"),
                *("set_draining", "move", "workers"),
            )
        }

    @classmethod
    async def connect(cls, url: str, prefix: str = "rs") -> RedisRegistry:
        """A registry on the Redis at `url`, which has answered (see `connect_redis`)."""
        return cls(await connect_redis(url, "registry", decode_responses=True), prefix)

    async def _call(self, name: str, *args: str) -> Any:
        op = uuid.uuid4().hex
        keys = [*self._keys, self._done + op]
        script = self._scripts[name]
        return await script(keys=keys, args=[self._base, op, str(REPLY_TTL_S), *args])

    async def register(
        self, info: WorkerInfo, sessions: Sequence[str] = (), lease_s: float = 20.0
    ) -> RegisterResult:
        check_worker(info)
        reported, lease_us = check_ids(sessions), micros(lease_s, "lease_s")
        w = info.worker_id
        args = (w, _info_json(info), str(info.slots), "1" if info.draining else "")
        served, stray, adopted = await self._call(
            "register", *args, info.instance, str(lease_us), *reported
        )
        return RegisterResult(_claims(served), list(stray), [Claim(w, s) for s in adopted])

    async def heartbeat(
        self,
        worker_id: str,
        load: dict[str, Any],
        sessions: Sequence[str] | None = None,
        claim_grace_s: float = 30.0,
    ) -> HeartbeatResult:
        reported = None if sessions is None else check_ids(sessions)
        grace_us = micros(claim_grace_s, "claim_grace_s")
        reconcile = ("1", str(grace_us), *reported) if reported is not None else ("", "0")
        known, stray, released, served = await self._call(
            "heartbeat", worker_id, json.dumps(load), *reconcile
        )
        return HeartbeatResult(
            bool(known), list(stray), [Claim(worker_id, s) for s in released], _claims(served)
        )

    async def unregister(self, worker_id: str) -> list[Claim]:
        sessions = await self._call("unregister", worker_id)
        return [Claim(worker_id, s) for s in sessions]

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        if math.isnan(timeout_s):
            return {}  # as MemoryRegistry: nothing is older than NaN
        stale = await self._call("expire", repr(float(timeout_s)))
        return {w: [Claim(w, s) for s in sessions] for w, sessions in stale}

    async def request(
        self,
        session_id: str,
        requirements: Requirements,
        refuse_unservable: bool = False,
        owner: str = "",
        lease_s: float = 20.0,
        queued_at: int | None = None,
    ) -> Ticket:
        check_requirements(requirements)
        check_score(queued_at)
        lease_us = micros(lease_s, "lease_s")
        wants = "" if requirements == Requirements() else json.dumps(requirements.as_dict())
        refuse = "1" if refuse_unservable else ""
        score = "" if queued_at is None else str(queued_at)
        reply = await self._call("request", session_id, wants, refuse, owner, str(lease_us), score)
        return _ticket(session_id, reply)

    async def renew(self, owner: str, session_ids: Sequence[str], lease_s: float) -> None:
        sessions, lease_us = check_ids(session_ids), micros(lease_s, "lease_s")
        for first in range(0, len(sessions), 1000):  # one script a thousand: Redis stays lively
            await self._call("renew", owner, str(lease_us), *sessions[first : first + 1000])

    async def expire_leases(self) -> LeaseExpiry:
        released, dropped, served = await self._call("expire_leases")
        return LeaseExpiry(_claims(released), list(dropped), _claims(served))

    async def cancel(self, session_id: str) -> bool:
        (removed,) = await self._call("cancel", session_id)
        return bool(removed)

    async def withdraw(self, session_id: str) -> Withdrawn:
        waiting, holder, moved, served = await self._call("withdraw", session_id)
        return Withdrawn(
            bool(waiting),
            Claim(holder, session_id) if holder else None,
            _claims(served),
            [Claim(w, session_id) for w in moved],
        )

    async def park(self, session_id: str) -> bool:
        return bool(await self._call("park", session_id))

    async def unpark(self, session_id: str) -> list[Claim]:
        return _claims(await self._call("unpark", session_id))

    async def release(self, claim: Claim) -> list[Claim]:
        return _claims(await self._call("release", claim.worker_id, claim.session_id))

    async def holds(self, worker_id: str, session_id: str) -> bool:
        score: Any = await self._redis.zscore(f"{self._base}sessions:{worker_id}", session_id)
        return score is not None

    async def set_draining(self, worker_id: str, draining: bool) -> DrainResult:
        known, served = await self._call("set_draining", worker_id, "1" if draining else "")
        return DrainResult(bool(known), _claims(served))

    async def move(
        self, session_id: str, from_worker: str, owner: str = "", lease_s: float = 20.0
    ) -> Ticket:
        lease_us = micros(lease_s, "lease_s")
        reply = await self._call("move", session_id, from_worker, owner, str(lease_us))
        return _ticket(session_id, reply)

    async def position(self, session_id: str) -> int | None:
        rank: Any = await self._redis.zrank(self._queue_key, session_id)
        return None if rank is None else int(rank) + 1

    async def queue(self) -> list[str]:
        sessions: Any = await self._redis.zrange(self._queue_key, 0, -1)
        return list(sessions)

    async def worker_of(self, session_id: str) -> str | None:
        worker: Any = await self._redis.hget(self._holder_key, session_id)
        return None if worker is None else str(worker)

    async def owner_of(self, session_id: str) -> str | None:
        owner: Any = await self._redis.hget(self._owner_key, session_id)
        return None if owner is None else str(owner)

    async def workers(self) -> list[WorkerStatus]:
        """Every worker, in registration order; `last_seen` is the Redis server's clock."""
        script = self._scripts["workers"]
        rows = await script(keys=[*self._keys, self._done], args=[self._base, "", "0"])
        return [
            WorkerStatus(
                _info(json.loads(info), bool(draining)),
                tuple(sessions),
                float(seen),
                json.loads(load),
            )
            for _, info, seen, load, sessions, draining in rows
        ]

    async def close(self) -> None:
        await self._redis.aclose(close_connection_pool=True)


async def connect_registry(url: str | None) -> Registry:
    """The registry for `url`: None -> MemoryRegistry, redis:// or rediss:// -> RedisRegistry."""
    return MemoryRegistry() if url is None else await RedisRegistry.connect(url)
