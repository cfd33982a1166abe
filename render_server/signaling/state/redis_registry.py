"""The registry shared by several signaling replicas, kept in Redis.

It behaves as `MemoryRegistry` does (the rules are in `registry.py`); what changes is that several
processes act on the same state at once. Every operation that reads and then writes is one Lua
script, so Redis runs it whole, between any two commands of any replica: two replicas can never
hand one slot to two sessions, and the queue rule (no waiting request fits a free slot) holds
after each script, whoever ran it.

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
from urllib.parse import urlsplit, urlunsplit

from redis.exceptions import RedisError

from render_server.signaling.state.redis import redis_client
from render_server.signaling.state.registry import (
    Claim,
    MemoryRegistry,
    Registry,
    Requirements,
    Ticket,
    WorkerInfo,
    WorkerStatus,
    check_requirements,
    check_worker,
)

REPLY_TTL_S = 60  # how long a reply is kept for a retried call (redis-py retries within seconds)

# The Lua twin of `Requirements.fits` (registry.py): change both together; the tests compare them.
# Inputs were checked by `check_requirements` / `check_worker`, so resolutions are "WxH" digits.
FITS_LUA = """
local function is_null(v) return v == nil or v == cjson.null end

local function fits(req, info)
  if #req.labels > 0 then
    local have = {}
    for _, label in ipairs(info.labels) do have[label] = true end
    for _, label in ipairs(req.labels) do
      if not have[label] then return false end
    end
  end
  if not is_null(req.region) and info.region ~= req.region then return false end
  local caps = info.capabilities
  if not is_null(req.codec) then
    local found = false
    if type(caps.codecs) == 'table' then
      for _, codec in ipairs(caps.codecs) do
        if codec == req.codec then found = true break end
      end
    end
    if not found then return false end
  end
  if not is_null(req.resolution) then
    local want_w, want_h = string.match(req.resolution, '^(%d+)[xX](%d+)$')
    local have = caps.resolution
    if is_null(have) then have = '0x0' end
    local have_w, have_h = string.match(have, '^(%d+)[xX](%d+)$')
    if tonumber(have_w) < tonumber(want_w) or tonumber(have_h) < tonumber(want_h) then
      return false
    end
  end
  return true
end
"""

# Shared by every script: KEYS are the fixed keys (then the call's reply key), ARGV[1] the prefix
# of the per-worker session sets, ARGV[2] the call's id, ARGV[3] how long a reply is kept; the
# operation's own arguments follow.
COMMON_LUA = (
    """
local K_WORKERS, K_SLOTS, K_USED, K_FREE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_ORDER, K_SEEN, K_LOAD, K_QUEUE = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_WANTS, K_HOLDER, K_SEQ, DONE = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local SESSIONS = ARGV[1]
"""
    + FITS_LUA
    + """
-- server time, as a decimal string (exact in a zset score) and as the same double
local function now()
  local t = redis.call('TIME')
  local text = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  return text, tonumber(text)
end

-- a retried call answers what it answered the first time
local function replay()
  local reply = redis.call('GET', DONE)
  if reply then return cjson.decode(reply) end
  return nil
end

-- keep a reply that a retry could not give again (what it freed or served is gone by then)
local function remember(reply)
  if #reply > 0 then redis.call('SET', DONE, cjson.encode(reply), 'EX', tonumber(ARGV[3])) end
  return reply
end

-- a request's requirements; nil for "" (no requirement: any worker)
local function requirements(text)
  if text == '' then return nil end
  return cjson.decode(text)
end

-- the least-loaded choice: lowest used/slots, then most free slots; ties go to the worker met
-- first, and workers are met in id order (see free_workers)
local function better(a, b)
  local ra, rb = a.used / a.slots, b.used / b.slots
  if ra ~= rb then return ra < rb end
  return a.slots - a.used > b.slots - b.used
end

local function hmget(key, ids)  -- unpack() takes a limited number of arguments: in parts
  local out = {}
  for first = 1, #ids, 1000 do
    local part = redis.call('HMGET', key, unpack(ids, first, math.min(first + 999, #ids)))
    for j = 1, #part do out[first + j - 1] = tonumber(part[j]) or 0 end
  end
  return out
end

-- the workers with a free slot, {id, slots, used}, in id order: members of one score in a zset
-- are kept in byte order, which for UTF-8 is Python's str order (Lua's `<` on strings would
-- follow strcoll, which depends on the locale Redis runs in)
local function free_workers()
  local ids = redis.call('ZRANGE', K_FREE, 0, -1)
  if #ids == 0 then return ids end
  local slots, used = hmget(K_SLOTS, ids), hmget(K_USED, ids)
  local free = {}
  for i, id in ipairs(ids) do free[i] = {id = id, slots = slots[i], used = used[i]} end
  return free
end

local function info_of(w)  -- decoded once per script, and only when a requirement needs it
  if w.info == nil then w.info = cjson.decode(redis.call('HGET', K_WORKERS, w.id)) end
  return w.info
end

local function best(free, req)
  local pick = nil
  for _, w in ipairs(free) do
    if w.used < w.slots and (pick == nil or better(w, pick))
        and (req == nil or fits(req, info_of(w))) then
      pick = w
    end
  end
  return pick
end

local function claim(session, w)
  redis.call('ZADD', SESSIONS .. w.id, redis.call('INCR', K_SEQ), session)
  redis.call('HSET', K_HOLDER, session, w.id)
  w.used = redis.call('HINCRBY', K_USED, w.id, 1)
  if w.used >= w.slots then redis.call('ZREM', K_FREE, w.id) end
end

-- serve the queue in arrival order; returns {session, worker, session, worker, ...}
local function serve()
  local served = {}
  local free = free_workers()
  if #free == 0 then return served end
  local slots_left = 0
  for _, w in ipairs(free) do slots_left = slots_left + w.slots - w.used end
  local after, page_size = '-inf', 8
  while slots_left > 0 do
    local page = redis.call('ZRANGEBYSCORE', K_QUEUE, after, '+inf', 'WITHSCORES',
                            'LIMIT', 0, page_size)
    if #page == 0 then break end
    for i = 1, #page, 2 do
      local session = page[i]
      local w = best(free, requirements(redis.call('HGET', K_WANTS, session)))
      if w then
        claim(session, w)
        redis.call('ZREM', K_QUEUE, session)
        redis.call('HDEL', K_WANTS, session)
        served[#served + 1] = session
        served[#served + 1] = w.id
        slots_left = slots_left - 1
        if slots_left == 0 then break end
      end
    end
    after = '(' .. page[#page]
    page_size = math.min(page_size * 4, 512)
  end
  return served
end

-- forget a worker; returns the sessions it held
local function drop(id)
  for _, key in ipairs({K_WORKERS, K_SLOTS, K_USED, K_LOAD}) do redis.call('HDEL', key, id) end
  for _, key in ipairs({K_FREE, K_ORDER, K_SEEN}) do redis.call('ZREM', key, id) end
  local key = SESSIONS .. id
  local sessions = redis.call('ZRANGE', key, 0, -1)
  for _, session in ipairs(sessions) do redis.call('HDEL', K_HOLDER, session) end
  redis.call('DEL', key)
  return sessions
end
"""
)

# Each script: its own arguments start at ARGV[4].
REGISTER_LUA = """
local done = replay() if done then return done end
local id, info, slots = ARGV[4], ARGV[5], tonumber(ARGV[6])
local seen = now()
redis.call('HSET', K_WORKERS, id, info)
redis.call('HSET', K_SLOTS, id, slots)
if (tonumber(redis.call('HGET', K_USED, id)) or 0) < slots then
  redis.call('ZADD', K_FREE, 0, id)
else
  redis.call('ZREM', K_FREE, id)
end
if not redis.call('ZSCORE', K_ORDER, id) then
  redis.call('ZADD', K_ORDER, redis.call('INCR', K_SEQ), id)
end
redis.call('ZADD', K_SEEN, seen, id)
return remember(serve())
"""

HEARTBEAT_LUA = """
local id, load = ARGV[4], ARGV[5]
if redis.call('HEXISTS', K_WORKERS, id) == 0 then return 0 end
local seen = now()
redis.call('ZADD', K_SEEN, seen, id)
redis.call('HSET', K_LOAD, id, load)
return 1
"""

UNREGISTER_LUA = """
local done = replay() if done then return done end
return remember(drop(ARGV[4]))
"""

EXPIRE_LUA = """
local done = replay() if done then return done end
local _, seconds = now()
local cutoff = seconds - tonumber(ARGV[4])
local stale = redis.call('ZRANGEBYSCORE', K_SEEN, '-inf', '(' .. string.format('%.17g', cutoff))
local out = {}
for _, id in ipairs(stale) do out[#out + 1] = {id, drop(id)} end
return remember(out)
"""

# A retried request needs no kept reply: asked again, it answers the same claim or place.
REQUEST_LUA = """
local session, wants = ARGV[4], ARGV[5]
local held = redis.call('HGET', K_HOLDER, session)
if held then return {'claim', held} end
local rank = redis.call('ZRANK', K_QUEUE, session)
if rank then return {'queued', rank + 1} end
local w = best(free_workers(), requirements(wants))
if w then
  claim(session, w)
  return {'claim', w.id}
end
redis.call('ZADD', K_QUEUE, redis.call('INCR', K_SEQ), session)
redis.call('HSET', K_WANTS, session, wants)
return {'queued', redis.call('ZCARD', K_QUEUE)}
"""

CANCEL_LUA = """
local done = replay() if done then return done end
if redis.call('ZREM', K_QUEUE, ARGV[4]) == 0 then return {0} end
redis.call('HDEL', K_WANTS, ARGV[4])
return remember({1})
"""

RELEASE_LUA = """
local done = replay() if done then return done end
local id, session = ARGV[4], ARGV[5]
if redis.call('ZREM', SESSIONS .. id, session) == 0 then return {} end
redis.call('HDEL', K_HOLDER, session)
if redis.call('HINCRBY', K_USED, id, -1) < tonumber(redis.call('HGET', K_SLOTS, id)) then
  redis.call('ZADD', K_FREE, 0, id)
end
return remember(serve())
"""

WORKERS_LUA = """
local out = {}
for _, id in ipairs(redis.call('ZRANGE', K_ORDER, 0, -1)) do
  out[#out + 1] = {
    id,
    redis.call('HGET', K_WORKERS, id),
    redis.call('ZSCORE', K_SEEN, id),
    redis.call('HGET', K_LOAD, id) or '{}',
    redis.call('ZRANGE', SESSIONS .. id, 0, -1),
  }
end
return out
"""


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

    def __init__(self, url: str, prefix: str = "rs") -> None:
        self.url = url
        self.prefix = prefix
        self._redis = redis_client(url, decode_responses=True)  # a burst waits for a connection
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
        script = self._redis.register_script
        self._register = script(COMMON_LUA + REGISTER_LUA)
        self._heartbeat = script(COMMON_LUA + HEARTBEAT_LUA)
        self._unregister = script(COMMON_LUA + UNREGISTER_LUA)
        self._expire = script(COMMON_LUA + EXPIRE_LUA)
        self._request = script(COMMON_LUA + REQUEST_LUA)
        self._cancel = script(COMMON_LUA + CANCEL_LUA)
        self._release = script(COMMON_LUA + RELEASE_LUA)
        self._workers = script(COMMON_LUA + WORKERS_LUA)

    @classmethod
    async def connect(cls, url: str, prefix: str = "rs") -> RedisRegistry:
        """A registry on `url` once Redis has answered a PING; ConnectionError otherwise."""
        registry = cls(url, prefix)
        try:
            await registry._redis.ping()
        except (RedisError, OSError) as exc:
            await registry.close()
            raise ConnectionError(f"no Redis answers at {redact(url)}: {exc}") from exc
        return registry

    async def _call(self, script: Any, *args: str) -> Any:
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

    async def request(self, session_id: str, requirements: Requirements) -> Ticket:
        check_requirements(requirements)
        wants = "" if requirements == Requirements() else json.dumps(requirements.as_dict())
        kind, value = await self._call(self._request, session_id, wants)
        if kind == "claim":
            return Ticket(session_id, claim=Claim(value, session_id))
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
    if url is None:
        return MemoryRegistry()
    if urlsplit(url).scheme in ("redis", "rediss"):
        return await RedisRegistry.connect(url)
    raise ValueError(f"registry URL must start with redis:// or rediss://, not {redact(url)!r}")
