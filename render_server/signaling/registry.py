"""Where workers and their free slots are kept; a claim hands one slot to one session."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Claim:
    worker_id: str
    session_id: str


@dataclass(frozen=True)
class WorkerStatus:
    info: WorkerInfo
    sessions: tuple[str, ...]

    @property
    def free(self) -> int:
        return self.info.slots - len(self.sessions)


class Registry(Protocol):
    async def register(self, info: WorkerInfo) -> None: ...

    async def unregister(self, worker_id: str) -> list[Claim]:
        """Forget a worker; returns the claims it held, which are void from now on."""
        ...

    async def claim(self, session_id: str) -> Claim | None:
        """A slot on the least-loaded worker with one free, or None when all are busy."""
        ...

    async def release(self, claim: Claim) -> bool:
        """Free a claimed slot; False if it was already free (released twice, worker gone)."""
        ...

    async def workers(self) -> list[WorkerStatus]: ...


class MemoryRegistry:
    """The one-process registry of `render-server serve`."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerInfo] = {}
        self._sessions: dict[str, dict[str, Claim]] = {}
        self._lock = asyncio.Lock()

    async def register(self, info: WorkerInfo) -> None:
        async with self._lock:
            self._workers[info.worker_id] = info
            self._sessions.setdefault(info.worker_id, {})

    async def unregister(self, worker_id: str) -> list[Claim]:
        async with self._lock:
            self._workers.pop(worker_id, None)
            return list(self._sessions.pop(worker_id, {}).values())

    async def claim(self, session_id: str) -> Claim | None:
        async with self._lock:
            best: WorkerInfo | None = None
            best_free = 0
            for worker_id, info in self._workers.items():
                free = info.slots - len(self._sessions[worker_id])
                if free > best_free:
                    best, best_free = info, free
            if best is None:
                return None
            claim = Claim(best.worker_id, session_id)
            self._sessions[best.worker_id][session_id] = claim
            return claim

    async def release(self, claim: Claim) -> bool:
        async with self._lock:
            sessions = self._sessions.get(claim.worker_id)
            return sessions is not None and sessions.pop(claim.session_id, None) is not None

    async def workers(self) -> list[WorkerStatus]:
        async with self._lock:
            return [
                WorkerStatus(info, tuple(self._sessions[wid]))
                for wid, info in self._workers.items()
            ]
