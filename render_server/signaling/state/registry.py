"""Where workers, their slots, sessions and the waiting queue are kept.

One protocol, two real implementations: `MemoryRegistry` (one process, `serve`;
memory_registry.py) and `RedisRegistry` (several signaling replicas share it; redis_registry.py).
Their values are in registry_types.py. The rules every implementation keeps:

- A claim is atomic: a slot goes to one session, never two, whichever replica asks.
- Whenever a slot frees, a worker registers or stops draining, queued requests are served in
  queue order: each waiting request, first first, gets a slot on a fitting worker if one is
  free. The assignments made are returned to the caller, which tells those browsers. So, after
  every operation, no waiting request fits a free slot.
- The queue is ordered by score: the (Redis) time of arrival in µs, or a score a replica gives
  back (`queued_at`, a re-queue after Redis lost its data keeps the order); ties by session id.
  A move off a draining worker waits ahead of every arrival (score: its time - 10^15 µs).
- `request` either claims a slot now or puts the session in the queue, never both. By the rule
  above that is fair: a free slot that fits a new request fits nobody waiting. Asked to
  (`refuse_unservable`, for a new session), it refuses instead of queueing a request that no
  registered, non-draining worker, free or busy, could ever serve; with none registered it
  queues (a fleet scaling up from zero serves it when the first worker registers). Asked again,
  it answers the same claim or place; a parked session asking again is unparked.
- A claim goes to the least-loaded fitting worker: the lowest used/slots ratio, ties broken by
  the most free slots, then by worker id (deterministic). A draining worker gets no new claim.
- Every claim and every queue or park entry has an owner (the signaling replica holding the
  browser, "" for a claim adopted from a worker's report) and a lease: `renew` moves both,
  `expire_leases` frees what nobody renewed (the owner died). A session's lease covers all it
  holds. Times are Redis's (`TIME`) for `RedisRegistry`, the injected clock for memory.
- A parked session (its browser went away) keeps its place but is skipped by serving; it has no
  position and is not in `queue()`.
- A session is in one worker's set, except during a move: it is claimed on the new worker (the
  holder, `worker_of`) and stays in the old one's set until that claim is released. `release`
  frees a slot only in the named worker's set, and clears the holder only if it is that worker;
  a worker that goes returns only the claims it was the holder of.
- A heartbeat that lists the worker's sessions reconciles: sessions it serves outside its set
  are stray (to be closed by it), claims in its set that it does not serve, made more than a
  grace ago, are freed. A registration that lists them adopts the unknown ones (as slots allow)
  and calls stray those placed elsewhere meanwhile.
- A worker that stops heart-beating is expired; the claims it held are returned so that their
  browsers can be told and re-placed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.memory_registry import MemoryRegistry
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
    check_requirements,
    check_worker,
)

__all__ = [
    "MOVE_AHEAD_US",
    "Claim",
    "DrainResult",
    "HeartbeatResult",
    "LeaseExpiry",
    "MemoryRegistry",
    "RegisterResult",
    "Registry",
    "Ticket",
    "Withdrawn",
    "WorkerInfo",
    "WorkerStatus",
    "check_requirements",
    "check_worker",
]


class Registry(Protocol):
    async def register(
        self, info: WorkerInfo, sessions: Sequence[str] = (), lease_s: float = 20.0
    ) -> RegisterResult:
        """Add (or replace, keeping its sessions) a worker and serve the queue. `sessions`, those
        it serves now: kept if in its set, stray if placed elsewhere (claimed, queued, parked),
        else adopted (claimed on it, owner "", a lease of `lease_s`) while slots last. Draining
        if `info.draining`, or if it was draining and `info.instance` is unchanged."""
        ...

    async def heartbeat(
        self,
        worker_id: str,
        load: dict[str, Any],
        sessions: Sequence[str] | None = None,
        claim_grace_s: float = 30.0,
    ) -> HeartbeatResult:
        """Note the worker alive; not `known` if it is unknown (expired: register again). With
        `sessions` (those it serves), reconcile its set with them (see the rules)."""
        ...

    async def unregister(self, worker_id: str) -> list[Claim]:
        """Forget a worker; returns the claims it was the holder of, void from now on."""
        ...

    async def expire(self, timeout_s: float) -> dict[str, list[Claim]]:
        """Unregister every worker not seen for `timeout_s`; its id → the claims it held."""
        ...

    async def request(
        self,
        session_id: str,
        requirements: Requirements,
        refuse_unservable: bool = False,
        owner: str = "",
        lease_s: float = 20.0,
        queued_at: int | None = None,
    ) -> Ticket:
        """Claim a slot for a session now, or queue it (at score `queued_at` if given), or
        (`refuse_unservable`) refuse it (see the rules); the claim or entry is `owner`'s, its
        lease ending `lease_s` from now (also when asked again)."""
        ...

    async def renew(self, owner: str, session_ids: Sequence[str], lease_s: float) -> None:
        """Each session that holds a claim or a queue/park entry: owned by `owner`, its lease
        ending `lease_s` from now. Others are ignored."""
        ...

    async def expire_leases(self) -> LeaseExpiry:
        """Free the claims, and drop the queue and park entries, whose lease has ended."""
        ...

    async def cancel(self, session_id: str) -> bool:
        """Take a waiting (queued or parked) session out; False if it was not waiting. It keeps a
        claim it holds: a session that ends calls `withdraw`."""
        ...

    async def withdraw(self, session_id: str) -> Withdrawn:
        """A session ended: take it out of the queue or park, release every claim it holds (also
        one it was just given by a release elsewhere) and serve the queue; all at once."""
        ...

    async def park(self, session_id: str) -> bool:
        """Keep a waiting session's place but skip it when serving; False if it is not waiting."""
        ...

    async def unpark(self, session_id: str) -> list[Claim]:
        """Put a parked session back at its place and serve the queue; the claims made."""
        ...

    async def release(self, claim: Claim) -> list[Claim]:
        """Free a claimed slot and serve the queue; returns the claims made for waiting sessions.

        Releasing twice, or a claim of a worker that is gone, frees nothing (and serves no one).
        """
        ...

    async def holds(self, worker_id: str, session_id: str) -> bool:
        """Whether the session is in the worker's set (holder or moving away from it)."""
        ...

    async def set_draining(self, worker_id: str, draining: bool) -> DrainResult:
        """Stop (or resume) giving the worker new claims; false if it is unknown. Resuming
        serves the queue."""
        ...

    async def move(
        self, session_id: str, from_worker: str, owner: str = "", lease_s: float = 20.0
    ) -> Ticket:
        """Place a session held by `from_worker` on another fitting, non-draining worker (a
        claim; the old one stays in `from_worker`'s set until released), or queue it ahead of
        every arrival. Not held by `from_worker`: an empty ticket, nothing done. `owner` ""
        keeps the session's owner."""
        ...

    async def position(self, session_id: str) -> int | None:
        """1-based place of a waiting session, None when it is not waiting (or parked)."""
        ...

    async def queue(self) -> list[str]:
        """The waiting sessions, first to be served first (parked ones left out)."""
        ...

    async def worker_of(self, session_id: str) -> str | None:
        """The worker holding the session's slot, or None."""
        ...

    async def owner_of(self, session_id: str) -> str | None:
        """The replica owning the session's claim or entry, None when it has neither."""
        ...

    async def workers(self) -> list[WorkerStatus]: ...

    async def close(self) -> None: ...
