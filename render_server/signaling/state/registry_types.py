"""What the registry takes and answers (see `registry.py` for the rules), and the checks of what
it takes: a value that the Lua twin of `Requirements.fits` could not judge, or that is not
JSON-able, is refused before it reaches a queue."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from render_server.protocol.requirements import Requirements
from render_server.protocol.worker import Register

MAX_INSTANCE = 64  # characters of `WorkerInfo.instance`
MAX_SCORE = 2**53  # a queue score must be exact in a double (a Redis zset score)


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    region: str | None = None
    replica: str = ""  # the signaling replica that holds the worker's socket ("" in-process)
    draining: bool = False  # takes no new claim (as the registry has it, in `workers()`)
    instance: str = ""  # an opaque nonce of the worker's process: kept and returned

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
    codecs = requirements.codecs
    if not isinstance(codecs, tuple) or not all(isinstance(c, str) for c in codecs):
        raise ValueError(f"codecs must be a tuple of strings, not {codecs!r}")
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
    if not isinstance(info.draining, bool):
        raise ValueError(f"draining must be a bool, not {info.draining!r}")
    if not isinstance(info.instance, str) or len(info.instance) > MAX_INSTANCE:
        raise ValueError(f"instance must be a string of at most {MAX_INSTANCE} characters")
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


def check_ids(ids: Iterable[str], what: str = "session ids") -> list[str]:
    """The ids as a list, without repeats, or ValueError if one is not a string."""
    if isinstance(ids, str):
        raise ValueError(f"{what} must be a list of strings, not one string {ids!r}")
    out = list(ids)
    if not all(isinstance(i, str) for i in out):
        raise ValueError(f"{what} must be strings: {out!r}")
    return list(dict.fromkeys(out))


def micros(seconds: float, what: str = "a duration") -> int:
    """A duration in whole microseconds, the registry's unit of time; ValueError if not finite."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {seconds!r}")
    if not math.isfinite(seconds) or abs(seconds) > 10**9:
        raise ValueError(f"{what} must be finite and at most 10^9 s, not {seconds!r}")
    return round(seconds * 1_000_000)


# a move (and a session whose worker was lost) waits ahead of every arrival: its score is its
# time - this (move.lua has the same number)
MOVE_AHEAD_US = 10**15


def check_score(queued_at: int | None) -> None:
    """Refuse (ValueError) a queue score that is not an integer a double holds exactly."""
    if queued_at is None:
        return
    if isinstance(queued_at, bool) or not isinstance(queued_at, int):
        raise ValueError(f"queued_at must be an integer (µs), not {queued_at!r}")
    if abs(queued_at) >= MAX_SCORE:
        raise ValueError(f"queued_at must be below 2^53 in size, not {queued_at}")


@dataclass(frozen=True)
class Claim:
    worker_id: str
    session_id: str


@dataclass(frozen=True)
class Ticket:
    """The answer to a request: a claim now, a place in the queue (1 = next), or `unservable`
    (no registered worker could ever serve it: neither claimed nor queued). `queued_at` is the
    queue score (Redis time in µs) of a waiting session, None otherwise."""

    session_id: str
    claim: Claim | None = None
    position: int | None = None
    unservable: bool = False
    queued_at: int | None = None


@dataclass(frozen=True)
class LeaseExpiry:
    """What `expire_leases` did."""

    released: list[Claim] = field(default_factory=list)  # claims whose lease ended: freed
    dropped: list[str] = field(default_factory=list)  # queue/park entries whose lease ended
    served: list[Claim] = field(default_factory=list)  # queued sessions the freed slots went to


@dataclass(frozen=True)
class Withdrawn:
    """What `withdraw` did."""

    was_waiting: bool  # it was queued or parked, now removed
    released: Claim | None = None  # it held a claim (e.g. just assigned): released
    served: list[Claim] = field(default_factory=list)  # the queue served by the freed slots
    # mid-move, the claims it still had on the workers it was moving from: released too
    also_released: list[Claim] = field(default_factory=list)


@dataclass(frozen=True)
class HeartbeatResult:
    """What `heartbeat` found; true when the worker is known (old callers test it as a bool)."""

    known: bool
    stray: list[str] = field(default_factory=list)  # served, not in its set: to be closed
    released: list[Claim] = field(default_factory=list)  # in its set, not served: freed
    served: list[Claim] = field(default_factory=list)  # queued sessions the freed slots went to

    def __bool__(self) -> bool:
        return self.known


@dataclass(frozen=True)
class RegisterResult:
    """What `register` did."""

    served: list[Claim] = field(default_factory=list)  # queued sessions it took
    stray: list[str] = field(default_factory=list)  # reported, but placed elsewhere: to close
    adopted: list[Claim] = field(default_factory=list)  # reported, unknown: claimed on it


@dataclass(frozen=True)
class DrainResult:
    """What `set_draining` did; true when the worker is known."""

    known: bool
    served: list[Claim] = field(default_factory=list)  # undrained: the queue it served

    def __bool__(self) -> bool:
        return self.known


@dataclass(frozen=True)
class WorkerStatus:
    info: WorkerInfo
    sessions: tuple[str, ...]
    last_seen: float  # time.time() of the last registration or heartbeat
    load: dict[str, Any] = field(default_factory=dict)  # what the last heartbeat said

    @property
    def free(self) -> int:
        return self.info.slots - len(self.sessions)
