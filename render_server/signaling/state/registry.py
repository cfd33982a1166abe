"""Where workers, their slots, sessions and the waiting queue are kept.

One small protocol, two real implementations: `MemoryRegistry` (one process, `serve`) and
`RedisRegistry` (several signaling replicas share it). The rules every implementation keeps:

- A claim is atomic: a slot goes to one session, never two, whichever replica asks.
- Whenever a slot frees or a worker registers, queued requests are served in arrival order:
  each waiting request, oldest first, gets a slot on a fitting worker if one is free. The
  assignments made are returned to the caller, which tells those browsers. So, after every
  operation, no waiting request fits a free slot.
- `request` either claims a slot now or puts the session at the end of the queue, never both.
  By the rule above that is fair: a free slot that fits a new request fits nobody waiting.
  Asked to (`refuse_unservable`, for a new session), it refuses instead of queueing a request
  that no registered worker, free or busy, could ever serve; with no worker registered at all
  it queues (a fleet scaling up from zero serves it when the first worker registers).
- A claim goes to the least-loaded fitting worker: the lowest used/slots ratio, ties broken by
  the most free slots, then by worker id (deterministic).
- A worker that stops heart-beating is expired; its sessions are returned so that their
  browsers can be told and re-placed.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from render_server.protocol.requirements import Requirements
from render_server.protocol.worker import Register


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    region: str | None = None
    replica: str = ""  # the signaling replica that holds the worker's socket ("" in-process)

    @classmethod
    def of(cls, registration: Register, replica: str) -> WorkerInfo:
        """The worker of a `worker.register`, held by signaling replica `replica`."""
        r = registration
        return cls(r.worker_id, r.slots, r.capabilities, r.labels, r.region, replica)


_RESOLUTION = re.compile(r"[0-9]{1,9}[xX][0-9]{1,9}")


def check_requirements(requirements: Requirements) -> None:
    """Refuse (ValueError) requirements that `fits` cannot judge, before they reach a queue.

    A malformed request left in the queue would make every later `register` and `release` fail.
    """
    if not all(isinstance(label, str) for label in requirements.labels):
        raise ValueError(f"labels must be strings: {sorted(map(repr, requirements.labels))}")
    for name in ("region", "codec"):
        value = getattr(requirements, name)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or absent, not {value!r}")
    res = requirements.resolution
    if res is not None and not (isinstance(res, str) and _RESOLUTION.fullmatch(res)):
        raise ValueError(f"resolution must be WIDTHxHEIGHT (digits), not {res!r}")


def check_worker(info: WorkerInfo) -> None:
    """Refuse (ValueError) a worker that `Requirements.fits` cannot judge, or not JSON-able."""
    if not isinstance(info.worker_id, str) or not info.worker_id:
        raise ValueError(f"worker_id must be a non-empty string, not {info.worker_id!r}")
    if isinstance(info.slots, bool) or not isinstance(info.slots, int):
        raise ValueError(f"slots must be an integer, not {info.slots!r}")
    if not 0 <= info.slots <= 10**9:
        raise ValueError(f"slots must be in 0..10^9, not {info.slots}")
    if not all(isinstance(label, str) for label in info.labels):
        raise ValueError(f"labels must be strings: {info.labels!r}")
    if info.region is not None and not isinstance(info.region, str):
        raise ValueError(f"region must be a string or absent, not {info.region!r}")
    caps = info.capabilities
    if not isinstance(caps, dict):
        raise ValueError(f"capabilities must be a dict, not {type(caps).__name__}")
    codecs = caps.get("codecs", ())
    if not isinstance(codecs, list | tuple) or not all(isinstance(c, str) for c in codecs):
        raise ValueError(f"capabilities.codecs must be a list of strings, not {codecs!r}")
    res = caps.get("resolution", "0x0")
    if not (isinstance(res, str) and _RESOLUTION.fullmatch(res)):
        raise ValueError(f"capabilities.resolution must be WIDTHxHEIGHT (digits), not {res!r}")
    try:
        json.dumps(caps, allow_nan=False)  # strict JSON, as Redis keeps it
    except (TypeError, ValueError) as exc:
        raise ValueError(f"capabilities must be JSON-able: {exc}") from None


@dataclass(frozen=True)
class Claim:
    worker_id: str
    session_id: str


@dataclass(frozen=True)
class Ticket:
    """The answer to a request: a claim now, a place in the queue (1 = next), or `unservable`
    (no registered worker could ever serve it: neither claimed nor queued)."""

    session_id: str
    claim: Claim | None = None
    position: int | None = None
    unservable: bool = False


@dataclass(frozen=True)
class WorkerStatus:
    info: WorkerInfo
    sessions: tuple[str, ...]
    last_seen: float  # time.time() of the last registration or heartbeat
    load: dict[str, Any] = field(default_factory=dict)  # what the last heartbeat said

    @property
    def free(self) -> int:
        return self.info.slots - len(self.sessions)


class Registry(Protocol):
    async def register(self, info: WorkerInfo) -> list[Claim]:
        """Add (or replace, keeping its sessions) a worker; returns queued requests it served."""
        ...

    async def heartbeat(self, worker_id: str, load: dict[str, Any]) -> bool:
        """Note the worker alive; False if it is unknown (expired: it must register again)."""
        ...

    async def unregister(self, worker_id: str) -> list[Claim]:
        """Forget a worker; returns the claims it held, which are void from now on."""
        ...

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        """Unregister every worker not seen for `timeout_s`; its id → the claims it held."""
        ...

    async def request(
        self, session_id: str, requirements: Requirements, refuse_unservable: bool = False
    ) -> Ticket:
        """Claim a slot for a new session now, or queue it, or (`refuse_unservable`) refuse
        it when no registered worker fits it (see the module's rules)."""
        ...

    async def cancel(self, session_id: str) -> bool:
        """Take a waiting session out of the queue; False if it was not waiting."""
        ...

    async def release(self, claim: Claim) -> list[Claim]:
        """Free a claimed slot and serve the queue; returns the claims made for waiting sessions.

        Releasing twice, or a claim of a worker that is gone, frees nothing (and serves no one).
        """
        ...

    async def position(self, session_id: str) -> int | None:
        """1-based place of a waiting session, None when it is not waiting."""
        ...

    async def queue(self) -> list[str]:
        """The waiting sessions, first to be served first."""
        ...

    async def worker_of(self, session_id: str) -> str | None:
        """The worker holding the session's slot, or None."""
        ...

    async def workers(self) -> list[WorkerStatus]: ...

    async def close(self) -> None: ...


class MemoryRegistry:
    """The one-process registry of `render-server serve` and single-replica deployments."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerInfo] = {}
        self._sessions: dict[str, dict[str, Claim]] = {}
        self._seen: dict[str, float] = {}
        self._load: dict[str, dict[str, Any]] = {}
        self._queue: dict[str, Requirements] = {}  # insertion order is arrival order
        self._lock = asyncio.Lock()

    async def register(self, info: WorkerInfo) -> list[Claim]:
        check_worker(info)
        async with self._lock:
            self._workers[info.worker_id] = info
            self._sessions.setdefault(info.worker_id, {})
            self._seen[info.worker_id] = time.time()
            return self._serve_queue()

    async def heartbeat(self, worker_id: str, load: dict[str, Any]) -> bool:
        async with self._lock:
            if worker_id not in self._workers:
                return False
            self._seen[worker_id] = time.time()
            self._load[worker_id] = dict(load)
            return True

    async def unregister(self, worker_id: str) -> list[Claim]:
        async with self._lock:
            return self._drop(worker_id)

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        async with self._lock:
            cutoff = time.time() - timeout_s
            stale = [w for w, seen in self._seen.items() if seen < cutoff]
            return {w: self._drop(w) for w in stale}

    async def request(
        self, session_id: str, requirements: Requirements, refuse_unservable: bool = False
    ) -> Ticket:
        check_requirements(requirements)
        async with self._lock:
            holder = self._holder(session_id)
            if holder is not None:  # asked again: the same answer, never a second slot
                return Ticket(session_id, claim=Claim(holder, session_id))
            if session_id not in self._queue:
                # fair by construction: the queue is served whenever a slot frees, so no waiting
                # request fits a free slot now; taking one skips ahead of nobody
                claim = self._claim(session_id, requirements)
                if claim is not None:
                    return Ticket(session_id, claim=claim)
                workers = self._workers.values()
                if refuse_unservable and workers and not any(map(requirements.fits, workers)):
                    return Ticket(session_id, unservable=True)
                self._queue[session_id] = requirements
            return Ticket(session_id, position=list(self._queue).index(session_id) + 1)

    async def cancel(self, session_id: str) -> bool:
        async with self._lock:
            return self._queue.pop(session_id, None) is not None

    async def release(self, claim: Claim) -> list[Claim]:
        async with self._lock:
            sessions = self._sessions.get(claim.worker_id)
            if sessions is None or sessions.pop(claim.session_id, None) is None:
                return []
            return self._serve_queue()

    async def position(self, session_id: str) -> int | None:
        async with self._lock:
            order = list(self._queue)
            return order.index(session_id) + 1 if session_id in self._queue else None

    async def queue(self) -> list[str]:
        async with self._lock:
            return list(self._queue)

    async def worker_of(self, session_id: str) -> str | None:
        async with self._lock:
            return self._holder(session_id)

    async def workers(self) -> list[WorkerStatus]:
        async with self._lock:
            return [
                WorkerStatus(
                    info, tuple(self._sessions[w]), self._seen[w], dict(self._load.get(w, {}))
                )
                for w, info in self._workers.items()
            ]

    async def close(self) -> None:
        pass

    # -- under the lock ----------------------------------------------------------------------

    def _holder(self, session_id: str) -> str | None:
        for worker_id, sessions in self._sessions.items():
            if session_id in sessions:
                return worker_id
        return None

    def _claim(self, session_id: str, requirements: Requirements) -> Claim | None:
        best: tuple[float, int, str] | None = None
        for worker_id, info in self._workers.items():
            used = len(self._sessions[worker_id])
            if used >= info.slots or not requirements.fits(info):
                continue
            key = (used / info.slots, -(info.slots - used), worker_id)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        claim = Claim(best[2], session_id)
        self._sessions[best[2]][session_id] = claim
        return claim

    def _serve_queue(self) -> list[Claim]:
        served = []
        free = sum(max(0, i.slots - len(self._sessions[w])) for w, i in self._workers.items())
        for session_id, requirements in list(self._queue.items()):
            if free == 0:  # the rest of the queue cannot be served: stop looking
                break
            claim = self._claim(session_id, requirements)
            if claim is not None:
                del self._queue[session_id]
                served.append(claim)
                free -= 1
        return served

    def _drop(self, worker_id: str) -> list[Claim]:
        self._workers.pop(worker_id, None)
        self._seen.pop(worker_id, None)
        self._load.pop(worker_id, None)
        return list(self._sessions.pop(worker_id, {}).values())
