"""Per-session facts every replica needs: whose session it is, its resume secret, its needs.

The registry knows slots and the queue; this store knows the session itself, so that a browser
can reload onto another replica (`session.resume`) and REST calls can find a session by id.
Records expire on their own (a day) should a replica die without cleaning up.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import redis.asyncio as aioredis

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.redis import connect_redis, lua_script

RECORD_TTL_S = 24 * 3600


def new_resume_token() -> str:
    return secrets.token_urlsafe(24)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class SessionRecord:
    session_id: str
    owner: str  # the token's subject; "anonymous" where authentication is off
    role: str
    token_hash: str  # sha256 of the resume token: the store never holds the token itself
    requirements: Requirements = field(default_factory=Requirements)
    generation: int = 1  # bumped by each resume: the older holder lets go
    created: float = field(default_factory=time.time)

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(self.token_hash, hash_token(token))

    def resumed(self) -> SessionRecord:
        return replace(self, generation=self.generation + 1)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["requirements"] = self.requirements.as_dict()
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionRecord:
        doc: dict[str, Any] = json.loads(text)
        doc["requirements"] = Requirements.from_dict(doc.get("requirements") or {})
        return cls(**doc)


class SessionStore(Protocol):
    async def put(self, record: SessionRecord) -> None: ...

    async def get(self, session_id: str) -> SessionRecord | None: ...

    async def bump(self, session_id: str) -> SessionRecord | None:
        """Increment the generation atomically (a resume); None if the session is gone."""
        ...

    async def delete(self, session_id: str) -> None: ...

    async def close(self) -> None: ...


class MemorySessionStore:
    def __init__(self) -> None:
        self._records: dict[str, SessionRecord] = {}

    async def put(self, record: SessionRecord) -> None:
        self._records[record.session_id] = record

    async def get(self, session_id: str) -> SessionRecord | None:
        return self._records.get(session_id)

    async def bump(self, session_id: str) -> SessionRecord | None:
        record = self._records.get(session_id)
        if record is not None:
            record = self._records[session_id] = record.resumed()
        return record

    async def delete(self, session_id: str) -> None:
        self._records.pop(session_id, None)

    async def close(self) -> None:
        pass


class RedisSessionStore:
    def __init__(self, client: aioredis.Redis, prefix: str = "rs") -> None:
        self._redis = client
        self._prefix = prefix
        self._bump = self._redis.register_script(lua_script("bump_generation"))

    def _key(self, session_id: str) -> str:
        return f"{self._prefix}:record:{session_id}"

    async def put(self, record: SessionRecord) -> None:
        await self._redis.set(self._key(record.session_id), record.to_json(), ex=RECORD_TTL_S)

    async def get(self, session_id: str) -> SessionRecord | None:
        text = await self._redis.get(self._key(session_id))
        return SessionRecord.from_json(text) if text else None

    async def bump(self, session_id: str) -> SessionRecord | None:
        text = await self._bump(keys=[self._key(session_id)])
        return SessionRecord.from_json(text) if text else None

    async def delete(self, session_id: str) -> None:
        await self._redis.delete(self._key(session_id))

    async def close(self) -> None:
        await self._redis.aclose(close_connection_pool=True)


async def connect_session_store(url: str | None, prefix: str = "rs") -> SessionStore:
    """The store for `url`: None -> MemorySessionStore, a Redis URL -> RedisSessionStore."""
    if url is None:
        return MemorySessionStore()
    return RedisSessionStore(await connect_redis(url, "session store"), prefix)
