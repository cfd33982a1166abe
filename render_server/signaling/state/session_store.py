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

from render_server.signaling.state.registry import Requirements

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


_BUMP = """
local text = redis.call('GET', KEYS[1])
if not text then return nil end
local doc = cjson.decode(text)
doc['generation'] = doc['generation'] + 1
local out = cjson.encode(doc)
redis.call('SET', KEYS[1], out, 'KEEPTTL')
return out
"""


class RedisSessionStore:
    def __init__(self, url: str, prefix: str = "rs") -> None:
        from render_server.signaling.state.redis import redis_client

        self._redis = redis_client(url)
        self._prefix = prefix
        self._bump = self._redis.register_script(_BUMP)

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


def connect_session_store(url: str | None, prefix: str = "rs") -> SessionStore:
    return MemorySessionStore() if url is None else RedisSessionStore(url, prefix)
