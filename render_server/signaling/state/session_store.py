"""Per-session facts every replica needs: whose session it is, from where, its resume secret, its
needs; and how many sessions each token subject and each address holds, fleet-wide.

The registry knows slots and the queue; this store knows the session itself, so that a browser
can reload onto another replica (`session.resume`) and REST calls can find a session by id. It
also counts the sessions (queue places included) of each subject and address, for the caps:
`admit` counts and stores in one step, so two replicas never both take the last place.

A record is a lease of `lease_s` seconds: the replica holding the session renews it
(`SessionTable.keep_alive`) well within that, and `delete` forgets it when the session ends. A
record that outlives its session (its replica died and no browser resumed it elsewhere) expires
within one lease, and stops counting against its subject and address with it. The holder renews
with its own copy of each record: what Redis lost (a restart) is stored and counted again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal, Protocol

import redis.asyncio as aioredis

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.redis import connect_redis, lua_script

log = logging.getLogger(__name__)

RECORD_LEASE_S = 60.0  # the holding replica renews every quarter of it (SessionTable)
RENEW_BATCH = 200  # sessions renewed per Redis call

CapName = Literal["subject", "address"]
CAPS: tuple[CapName, ...] = ("subject", "address")


def new_resume_token() -> str:
    return secrets.token_urlsafe(24)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    owner: str  # the token's subject; "anonymous" where authentication is off
    role: str  # the role of the token last presented for it (start or resume)
    token_hash: str  # sha256 of the resume token: the store never holds the token itself
    requirements: Requirements = field(default_factory=Requirements)
    generation: int = 1  # bumped by each resume: the older holder lets go
    created: float = field(default_factory=time.time)
    address: str = ""  # the client address that created it (the per-address cap)
    share_epoch: int = 0  # bumped when the owner stops sharing: older share links open nothing

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(token))

    def resumed(self, role: str | None = None) -> SessionRecord:
        return replace(self, generation=self.generation + 1, role=role or self.role)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["requirements"] = self.requirements.as_dict()
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionRecord:
        doc: dict[str, Any] = json.loads(text)
        known = {f.name for f in fields(cls)}  # a newer replica's extra facts are skipped
        doc = {k: v for k, v in doc.items() if k in known}
        doc["requirements"] = Requirements.from_dict(doc.get("requirements") or {})
        return cls(**doc)


@dataclass(frozen=True)
class SessionCaps:
    """Sessions (queue places included) one subject and one address may hold; 0: no cap."""

    per_subject: int = 0
    per_address: int = 0


@dataclass(frozen=True)
class CapReached:
    """Why `admit` refused: which cap, how many sessions are held, and the cap."""

    cap: CapName
    held: int
    limit: int


class SessionStore(Protocol):
    lease_s: float  # a record not renewed for this long expires

    async def admit(self, record: SessionRecord, caps: SessionCaps) -> CapReached | None:
        """Store a new session's record unless its owner or address is at a cap: the refusal,
        or None once stored. Counting and storing are one step, fleet-wide."""
        ...

    async def get(self, session_id: str) -> SessionRecord | None: ...

    async def bump(self, session_id: str, role: str | None = None) -> SessionRecord | None:
        """Increment the generation atomically (a resume) and take the resuming token's `role`;
        None if the session is gone."""
        ...

    async def stop_sharing(self, session_id: str) -> SessionRecord | None:
        """Increment the share epoch atomically (share links minted before open nothing);
        None if the session is gone."""
        ...

    async def renew(self, records: Iterable[SessionRecord]) -> int:
        """Extend the leases of the sessions this replica holds (their records and their places
        in the counts). A record that is gone (Redis restarted, or its lease lapsed while Redis
        was away) is stored again from the holder's copy, and counts again, without the caps'
        checks: the session runs already. A record still stored keeps its value (a resume
        elsewhere may have bumped it). Returns how many records were stored again."""
        ...

    async def held(self, cap: CapName, name: str) -> int:
        """How many live sessions the subject or address `name` holds."""
        ...

    async def delete(self, session_id: str) -> None: ...

    async def close(self) -> None: ...


class MemorySessionStore:
    """One process's store. Every method runs without awaiting: each is atomic in its loop."""

    def __init__(
        self, lease_s: float = RECORD_LEASE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.lease_s = lease_s
        self._clock = clock
        self._records: dict[str, SessionRecord] = {}
        self._until: dict[str, float] = {}  # session id -> when its lease ends
        self._holders: dict[tuple[CapName, str], set[str]] = {}

    async def admit(self, record: SessionRecord, caps: SessionCaps) -> CapReached | None:
        for cap, limit in zip(CAPS, (caps.per_subject, caps.per_address), strict=True):
            held = self._held(cap, _name_of(record, cap))
            if limit and held >= limit:
                return CapReached(cap, held, limit)
        self._store(record)
        return None

    async def get(self, session_id: str) -> SessionRecord | None:
        return self._live(session_id)

    async def bump(self, session_id: str, role: str | None = None) -> SessionRecord | None:
        record = self._live(session_id)
        if record is not None:
            record = self._records[session_id] = record.resumed(role)
        return record

    async def stop_sharing(self, session_id: str) -> SessionRecord | None:
        record = self._live(session_id)
        if record is not None:
            epoch = record.share_epoch + 1
            record = self._records[session_id] = replace(record, share_epoch=epoch)
        return record

    async def renew(self, records: Iterable[SessionRecord]) -> int:
        until, restored = self._clock() + self.lease_s, 0
        for record in records:
            if self._live(record.session_id) is not None:
                self._until[record.session_id] = until
            else:
                self._store(record)
                restored += 1
        return restored

    async def held(self, cap: CapName, name: str) -> int:
        return self._held(cap, name)

    async def delete(self, session_id: str) -> None:
        if session_id in self._records:
            self._forget(session_id)

    async def close(self) -> None:
        pass

    def _store(self, record: SessionRecord) -> None:
        self._records[record.session_id] = record
        self._until[record.session_id] = self._clock() + self.lease_s
        for cap in CAPS:
            self._holders.setdefault((cap, _name_of(record, cap)), set()).add(record.session_id)

    def _live(self, session_id: str) -> SessionRecord | None:
        """The record unless its lease ended (then it is forgotten, as Redis expires it)."""
        record = self._records.get(session_id)
        if record is not None and self._until[session_id] <= self._clock():
            self._forget(session_id)
            return None
        return record

    def _forget(self, session_id: str) -> None:
        record = self._records.pop(session_id)
        del self._until[session_id]
        for cap in CAPS:
            key = (cap, _name_of(record, cap))
            self._holders[key].discard(session_id)
            if not self._holders[key]:
                del self._holders[key]

    def _held(self, cap: CapName, name: str) -> int:
        for session_id in list(self._holders.get((cap, name), ())):
            self._live(session_id)  # forgets the expired ones
        return len(self._holders.get((cap, name), ()))


def _name_of(record: SessionRecord, cap: CapName) -> str:
    return record.owner if cap == "subject" else record.address


class RedisSessionStore:
    """The store several replicas share. Keys, under `{prefix}:` (one Redis Cluster slot):

    record:<session id>   str   the record as JSON, expiring with its lease
    held:subject:<hash>   zset  session id -> when its lease ends (Redis time): a subject's
    held:address:<hash>   zset  ... and an address's sessions; entries past their lease
                                are dropped before counting, and the set expires with them
    """

    def __init__(
        self, client: aioredis.Redis, prefix: str = "rs", lease_s: float = RECORD_LEASE_S
    ) -> None:
        self._redis = client
        self._base = f"{{{prefix}}}:"
        self.lease_s = lease_s
        self._bump = self._redis.register_script(lua_script("bump_generation"))
        self._unshare = self._redis.register_script(lua_script("bump_share_epoch"))
        self._admit = self._redis.register_script(lua_script("session_admit"))
        self._renew = self._redis.register_script(lua_script("session_renew"))
        self._delete = self._redis.register_script(lua_script("session_delete"))
        self._held = self._redis.register_script(lua_script("session_held"))

    def _key(self, session_id: str) -> str:
        return f"{self._base}record:{session_id}"

    def _held_key(self, cap: CapName, name: str) -> str:
        # hashed: a subject is whatever a token says, of any length and any characters
        return f"{self._base}held:{cap}:{hashlib.sha256(name.encode()).hexdigest()[:32]}"

    def _keys(self, record: SessionRecord) -> list[str]:
        return [
            self._key(record.session_id),
            self._held_key("subject", record.owner),
            self._held_key("address", record.address),
        ]

    async def admit(self, record: SessionRecord, caps: SessionCaps) -> CapReached | None:
        args = [record.to_json(), record.session_id, repr(self.lease_s)]
        reply = await self._admit(
            keys=self._keys(record), args=[*args, caps.per_subject, caps.per_address]
        )
        if not reply:
            return None
        cap, held, limit = reply
        name: CapName = "subject" if _text(cap) == "subject" else "address"
        return CapReached(name, int(held), int(limit))

    async def get(self, session_id: str) -> SessionRecord | None:
        text = await self._redis.get(self._key(session_id))
        return SessionRecord.from_json(text) if text else None

    async def bump(self, session_id: str, role: str | None = None) -> SessionRecord | None:
        text = await self._bump(keys=[self._key(session_id)], args=[role or ""])
        return SessionRecord.from_json(text) if text else None

    async def stop_sharing(self, session_id: str) -> SessionRecord | None:
        text = await self._unshare(keys=[self._key(session_id)])
        return SessionRecord.from_json(text) if text else None

    async def renew(self, records: Iterable[SessionRecord]) -> int:
        """One script call per RENEW_BATCH records; safe to retry (it sets, never adds)."""
        items, restored = list(records), 0
        for first in range(0, len(items), RENEW_BATCH):
            batch = items[first : first + RENEW_BATCH]
            keys = [key for record in batch for key in self._keys(record)]
            pairs = [arg for record in batch for arg in (record.session_id, record.to_json())]
            restored += int(await self._renew(keys=keys, args=[repr(self.lease_s), *pairs]))
        if restored:
            log.info("store.records_restored", extra={"records": restored})
        return restored

    async def held(self, cap: CapName, name: str) -> int:
        return int(await self._held(keys=[self._held_key(cap, name)]))

    async def delete(self, session_id: str) -> None:
        record = await self.get(session_id)
        if record is None:
            return  # gone already; its places in the counts lapse with their leases
        await self._delete(keys=self._keys(record), args=[session_id])

    async def close(self) -> None:
        await self._redis.aclose(close_connection_pool=True)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def connect_session_store(url: str | None, prefix: str = "rs") -> SessionStore:
    """The store for `url`: None -> MemorySessionStore, a Redis URL -> RedisSessionStore."""
    if url is None:
        return MemorySessionStore()
    return RedisSessionStore(await connect_redis(url, "session store"), prefix)
