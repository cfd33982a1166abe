"""The one-process registry (`render-server serve`, single-replica deployments): the rules of
`registry.py` on plain dicts under one lock. `RedisRegistry` gives the same answers (the tests
compare them), so the shapes here mirror its data model: times in µs, queue scores, the holder
index and the workers a session moves away from."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.registry_types import (
    MOVE_AHEAD_US,
    Claim,
    DrainResult,
    HeartbeatResult,
    LeaseExpiry,
    RegisterResult,
    Ticket,
    Withdrawn,
    WorkerInfo,
    WorkerStatus,
    check_ids,
    check_requirements,
    check_score,
    check_worker,
    micros,
)

ANY = Requirements()


class MemoryRegistry:
    """The one-process registry; `clock` (seconds) is injectable so that tests can move time."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._workers: dict[str, WorkerInfo] = {}  # in registration order
        self._draining: set[str] = set()
        self._sessions: dict[str, dict[str, int]] = {}  # worker -> session -> claimed at (µs)
        self._seen: dict[str, float] = {}
        self._load: dict[str, dict[str, Any]] = {}
        self._holder: dict[str, str] = {}  # session -> the worker of its newest claim
        self._moved: dict[str, list[str]] = {}  # session -> other workers whose sets hold it
        self._queue: dict[str, int] = {}  # session -> score
        self._parked: dict[str, int] = {}  # session -> score
        self._wants: dict[str, Requirements] = {}  # of every known session
        self._owner: dict[str, str] = {}
        self._lease: dict[str, int] = {}  # session -> when its lease ends (µs)
        self._lock = asyncio.Lock()

    async def register(
        self, info: WorkerInfo, sessions: Sequence[str] = (), lease_s: float = 20.0
    ) -> RegisterResult:
        check_worker(info)
        reported, lease_us = check_ids(sessions), micros(lease_s, "lease_s")
        async with self._lock:
            t, w = self._now_us(), info.worker_id
            old = self._workers.get(w)
            stays = old is not None and w in self._draining and old.instance == info.instance
            self._workers[w] = info
            if info.draining or stays:
                self._draining.add(w)
            else:
                self._draining.discard(w)
            held = self._sessions.setdefault(w, {})
            self._seen[w] = self._clock()
            stray, adopted = [], []
            for session in reported:
                if session in held:
                    continue
                if self._known(session) or len(held) >= info.slots:
                    stray.append(session)
                    continue
                self._claim(session, w, t)
                self._wants[session] = ANY
                self._set_lease(session, "", t + lease_us)
                adopted.append(Claim(w, session))
            return RegisterResult(self._serve(t), stray, adopted)

    async def heartbeat(
        self,
        worker_id: str,
        load: dict[str, Any],
        sessions: Sequence[str] | None = None,
        claim_grace_s: float = 30.0,
    ) -> HeartbeatResult:
        reported = None if sessions is None else check_ids(sessions)
        grace_us = micros(claim_grace_s, "claim_grace_s")
        async with self._lock:
            if worker_id not in self._workers:
                return HeartbeatResult(False)
            self._seen[worker_id] = self._clock()
            self._load[worker_id] = dict(load)
            if reported is None:
                return HeartbeatResult(True)
            t, held = self._now_us(), self._sessions[worker_id]
            stray = [s for s in reported if s not in held]
            serves = set(reported)
            released = []
            for session, claimed_at in list(held.items()):
                if session not in serves and claimed_at < t - grace_us:
                    self._unclaim(session, worker_id)
                    self._forget_if_gone(session)
                    released.append(Claim(worker_id, session))
            return HeartbeatResult(True, stray, released, self._serve(t) if released else [])

    async def unregister(self, worker_id: str) -> list[Claim]:
        async with self._lock:
            return self._drop(worker_id)

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        async with self._lock:
            cutoff = self._clock() - timeout_s
            stale = [w for w, seen in self._seen.items() if seen < cutoff]
            return {w: self._drop(w) for w in stale}

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
        async with self._lock:
            t, s = self._now_us(), session_id
            ends = t + lease_us
            holder = self._holder.get(s)
            if holder is not None:  # asked again: the same answer, never a second slot
                self._set_lease(s, owner, ends)
                return Ticket(s, claim=Claim(holder, s))
            if s in self._parked:  # its browser is back: its old place, or a slot now
                self._queue[s] = self._parked.pop(s)
                worker = self._best(self._wants[s], self._holders_of(s))
                if worker is not None:
                    del self._queue[s]
                    self._claim(s, worker, t)
                    self._set_lease(s, owner, ends)
                    return Ticket(s, claim=Claim(worker, s))
            if s in self._queue:
                self._set_lease(s, owner, ends)
                return Ticket(s, position=self._position(s), queued_at=self._queue[s])
            # fair by construction: the queue is served whenever a slot frees, so no waiting
            # request fits a free slot now; taking one skips ahead of nobody
            worker = self._best(requirements, self._holders_of(s))
            if worker is not None:
                self._claim(s, worker, t)
                self._wants[s] = requirements
                self._set_lease(s, owner, ends)
                return Ticket(s, claim=Claim(worker, s))
            active = [i for w, i in self._workers.items() if w not in self._draining]
            if refuse_unservable and active and not any(map(requirements.fits, active)):
                return Ticket(s, unservable=True)
            self._queue[s] = t if queued_at is None else queued_at
            self._wants[s] = requirements
            self._set_lease(s, owner, ends)
            return Ticket(s, position=self._position(s), queued_at=self._queue[s])

    async def renew(self, owner: str, session_ids: Sequence[str], lease_s: float) -> None:
        sessions, lease_us = check_ids(session_ids), micros(lease_s, "lease_s")
        async with self._lock:
            ends = self._now_us() + lease_us
            for session in sessions:
                if session in self._lease:
                    self._set_lease(session, owner, ends)

    async def expire_leases(self) -> LeaseExpiry:
        async with self._lock:
            t = self._now_us()
            ended = sorted((end, s) for s, end in self._lease.items() if end <= t)
            released, dropped = [], []
            for _, session in ended:
                for worker in self._holders_of(session):
                    self._unclaim(session, worker)
                    released.append(Claim(worker, session))
                if self._unqueue(session):
                    dropped.append(session)
                self._forget_if_gone(session)
            return LeaseExpiry(released, dropped, self._serve(t) if released else [])

    async def cancel(self, session_id: str) -> bool:
        async with self._lock:
            waiting = self._unqueue(session_id)
            self._forget_if_gone(session_id)
            return waiting

    async def withdraw(self, session_id: str) -> Withdrawn:
        async with self._lock:
            s = session_id
            waiting = self._unqueue(s)
            holder, moved = self._holder.get(s), list(self._moved.get(s, ()))
            for worker in ([holder] if holder is not None else []) + moved:
                self._unclaim(s, worker)
            self._forget_if_gone(s)
            freed = holder is not None or bool(moved)
            return Withdrawn(
                waiting,
                None if holder is None else Claim(holder, s),
                self._serve(self._now_us()) if freed else [],
                [Claim(w, s) for w in moved],
            )

    async def park(self, session_id: str) -> bool:
        async with self._lock:
            if session_id in self._queue:
                self._parked[session_id] = self._queue.pop(session_id)
            return session_id in self._parked

    async def unpark(self, session_id: str) -> list[Claim]:
        async with self._lock:
            if session_id not in self._parked:
                return []
            self._queue[session_id] = self._parked.pop(session_id)
            return self._serve(self._now_us())

    async def release(self, claim: Claim) -> list[Claim]:
        async with self._lock:
            if not self._unclaim(claim.session_id, claim.worker_id):
                return []
            self._forget_if_gone(claim.session_id)
            return self._serve(self._now_us())

    async def holds(self, worker_id: str, session_id: str) -> bool:
        async with self._lock:
            return session_id in self._sessions.get(worker_id, {})

    async def set_draining(self, worker_id: str, draining: bool) -> DrainResult:
        async with self._lock:
            if worker_id not in self._workers:
                return DrainResult(False)
            if draining:
                self._draining.add(worker_id)
                return DrainResult(True)
            self._draining.discard(worker_id)
            return DrainResult(True, self._serve(self._now_us()))

    async def move(
        self, session_id: str, from_worker: str, owner: str = "", lease_s: float = 20.0
    ) -> Ticket:
        lease_us = micros(lease_s, "lease_s")
        async with self._lock:
            s, t = session_id, self._now_us()
            if self._holder.get(s) != from_worker:
                return Ticket(s)
            self._set_lease(s, owner or self._owner.get(s, ""), t + lease_us)
            if s in self._queue:  # already moving
                return Ticket(s, position=self._position(s), queued_at=self._queue[s])
            if s in self._parked:
                return Ticket(s, queued_at=self._parked[s])
            worker = self._best(self._wants.get(s, ANY), self._holders_of(s))
            if worker is not None:
                self._claim(s, worker, t)
                return Ticket(s, claim=Claim(worker, s))
            self._queue[s] = t - MOVE_AHEAD_US
            return Ticket(s, position=self._position(s), queued_at=self._queue[s])

    async def position(self, session_id: str) -> int | None:
        async with self._lock:
            return self._position(session_id) if session_id in self._queue else None

    async def queue(self) -> list[str]:
        async with self._lock:
            return self._queue_order()

    async def worker_of(self, session_id: str) -> str | None:
        async with self._lock:
            return self._holder.get(session_id)

    async def owner_of(self, session_id: str) -> str | None:
        async with self._lock:
            return self._owner.get(session_id)

    async def workers(self) -> list[WorkerStatus]:
        async with self._lock:
            return [
                WorkerStatus(
                    dataclasses.replace(info, draining=w in self._draining),
                    tuple(self._sessions[w]),
                    self._seen[w],
                    dict(self._load.get(w, {})),
                )
                for w, info in self._workers.items()
            ]

    async def close(self) -> None:
        pass

    # -- under the lock ----------------------------------------------------------------------

    def _now_us(self) -> int:
        return round(self._clock() * 1_000_000)

    def _queue_order(self) -> list[str]:
        return sorted(self._queue, key=lambda s: (self._queue[s], s))

    def _position(self, session_id: str) -> int:
        return self._queue_order().index(session_id) + 1

    def _holders_of(self, session_id: str) -> list[str]:
        """Every worker whose set holds the session: the holder first, then those it leaves."""
        holder = self._holder.get(session_id)
        return ([] if holder is None else [holder]) + self._moved.get(session_id, [])

    def _known(self, session_id: str) -> bool:
        s = session_id
        return s in self._holder or s in self._moved or s in self._queue or s in self._parked

    def _set_lease(self, session_id: str, owner: str, ends: int) -> None:
        self._owner[session_id] = owner
        self._lease[session_id] = ends

    def _forget_if_gone(self, session_id: str) -> None:
        if not self._known(session_id):
            for table in (self._wants, self._owner, self._lease):
                table.pop(session_id, None)

    def _unqueue(self, session_id: str) -> bool:
        """Out of the queue or the park: whether it was waiting."""
        queued = self._queue.pop(session_id, None) is not None
        return self._parked.pop(session_id, None) is not None or queued

    def _best(self, requirements: Requirements, exclude: list[str]) -> str | None:
        best: tuple[float, int, str] | None = None
        for worker_id, info in self._workers.items():
            used = len(self._sessions[worker_id])
            if used >= info.slots or worker_id in self._draining or worker_id in exclude:
                continue
            if not requirements.fits(info):
                continue
            key = (used / info.slots, -(info.slots - used), worker_id)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def _claim(self, session_id: str, worker_id: str, t: int) -> None:
        holder = self._holder.get(session_id)
        if holder is not None and holder != worker_id:  # a move: the old claim stays
            self._moved.setdefault(session_id, []).append(holder)
        self._sessions[worker_id][session_id] = t
        self._holder[session_id] = worker_id

    def _unclaim(self, session_id: str, worker_id: str) -> bool:
        """Out of the worker's set (the holder index only if it is the holder): whether it was
        there."""
        sessions = self._sessions.get(worker_id)
        if sessions is None or sessions.pop(session_id, None) is None:
            return False
        if self._holder.get(session_id) == worker_id:
            del self._holder[session_id]
        else:
            self._leave(session_id, worker_id)
        return True

    def _leave(self, session_id: str, worker_id: str) -> None:
        """The session no longer in `worker_id`'s set, which it was moving away from."""
        kept = [w for w in self._moved.get(session_id, []) if w != worker_id]
        if kept:
            self._moved[session_id] = kept
        else:
            self._moved.pop(session_id, None)

    def _serve(self, t: int) -> list[Claim]:
        served = []
        free = sum(
            max(0, i.slots - len(self._sessions[w]))
            for w, i in self._workers.items()
            if w not in self._draining
        )
        for session_id in self._queue_order():
            if free == 0:  # the rest of the queue cannot be served: stop looking
                break
            worker = self._best(self._wants.get(session_id, ANY), self._holders_of(session_id))
            if worker is not None:
                del self._queue[session_id]
                self._claim(session_id, worker, t)
                served.append(Claim(worker, session_id))
                free -= 1
        return served

    def _drop(self, worker_id: str) -> list[Claim]:
        self._workers.pop(worker_id, None)
        self._draining.discard(worker_id)
        self._seen.pop(worker_id, None)
        self._load.pop(worker_id, None)
        held = []
        for session_id in self._sessions.pop(worker_id, {}):
            if self._holder.get(session_id) == worker_id:
                del self._holder[session_id]
                held.append(Claim(worker_id, session_id))
            else:
                self._leave(session_id, worker_id)
            self._forget_if_gone(session_id)
        return held
