"""Owners and leases, park, withdraw, reconciliation with what workers report, draining and
moves (registry.py's rules), on both registries. Memory moves time by its injected clock; Redis
takes its own (TIME), so its tests wait out short real leases."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.redis_registry import RedisRegistry
from render_server.signaling.state.registry import (
    Claim,
    LeaseExpiry,
    MemoryRegistry,
    Registry,
    Ticket,
    Withdrawn,
    WorkerInfo,
)

from .redis_server import fresh_prefix
from .test_registry import check_invariant, sessions_of

ANY = Requirements()
GPU = Requirements(labels=frozenset({"gpu"}))
SHORT = 0.3  # a lease that ends within a test
PAST = 0.5  # waited (or moved) to see a SHORT lease end
Advance = Callable[[float], Awaitable[None]]


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def timed(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Registry, Advance]]:
    """A registry and a way to let time pass for it."""
    reg: Registry
    if request.param == "memory":
        clock = Clock()
        reg = MemoryRegistry(clock)

        async def advance(seconds: float) -> None:
            clock.now += seconds

    else:
        reg = await RedisRegistry.connect(request.getfixturevalue("redis_url"), fresh_prefix())

        async def advance(seconds: float) -> None:
            await asyncio.sleep(seconds)

    yield reg, advance
    await reg.close()


@pytest.fixture(params=["memory", "redis"])
async def registry(request: pytest.FixtureRequest) -> AsyncIterator[Registry]:
    reg: Registry
    if request.param == "memory":
        reg = MemoryRegistry()
    else:
        reg = await RedisRegistry.connect(request.getfixturevalue("redis_url"), fresh_prefix())
    yield reg
    await reg.close()


async def free_slots(reg: Registry) -> int:
    return sum(w.free for w in await reg.workers())


# -- leases --------------------------------------------------------------------------------------


async def test_lease_expiry_of_claims_queue_and_park(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    await reg.register(WorkerInfo("a", 1))
    assert (await reg.request("s0", ANY, owner="r1", lease_s=SHORT)).claim == Claim("a", "s0")
    assert (await reg.request("s1", ANY, owner="r1", lease_s=60)).position == 1
    assert (await reg.request("s2", ANY, owner="r2", lease_s=SHORT)).position == 2
    assert (await reg.request("s3", ANY, owner="r2", lease_s=SHORT)).position == 3
    assert await reg.park("s3") is True
    assert await reg.expire_leases() == LeaseExpiry([], [], [])  # nothing ended yet
    assert await reg.owner_of("s0") == "r1"
    await advance(PAST)
    assert await reg.expire_leases() == LeaseExpiry(
        released=[Claim("a", "s0")], dropped=["s2", "s3"], served=[Claim("a", "s1")]
    )
    assert await reg.expire_leases() == LeaseExpiry([], [], [])
    assert await reg.queue() == []
    assert [await reg.owner_of(s) for s in ("s0", "s1", "s2", "s3")] == [None, "r1", None, None]
    assert await reg.worker_of("s1") == "a"
    assert await reg.unpark("s3") == []  # gone with its lease
    # its slot went to s1, whose lease (60 s) is running: no claim without a live owner
    assert await sessions_of(reg) == {"a": ("s1",)}


async def test_renew_changes_owner_and_extends(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    await reg.register(WorkerInfo("a", 1))
    await reg.request("s0", ANY, owner="r1", lease_s=SHORT)
    await reg.request("s1", ANY, owner="r1", lease_s=SHORT)
    await reg.request("s2", ANY, owner="r1", lease_s=SHORT)
    await reg.park("s2")
    await reg.renew("r2", ["s0", "s1", "s2", "nobody"], 60)  # resumed through replica r2
    assert [await reg.owner_of(s) for s in ("s0", "s1", "s2")] == ["r2"] * 3
    await advance(PAST)
    assert await reg.expire_leases() == LeaseExpiry([], [], [])
    # renew never creates anything
    assert await reg.owner_of("nobody") is None
    assert (await reg.worker_of("nobody"), await reg.position("nobody")) == (None, None)
    # a shorter renewal is a renewal too: it ends then
    await reg.renew("r3", ["s1"], SHORT)
    await advance(PAST)
    assert await reg.expire_leases() == LeaseExpiry(dropped=["s1"])
    assert await reg.owner_of("s1") is None


async def test_a_request_asked_again_renews(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    await reg.register(WorkerInfo("a", 1))
    await reg.request("s0", ANY, owner="r1", lease_s=SHORT)
    await reg.request("s1", ANY, owner="r1", lease_s=SHORT)
    assert (await reg.request("s0", ANY, owner="r2", lease_s=60)).claim == Claim("a", "s0")
    assert (await reg.request("s1", ANY, owner="r2", lease_s=60)).position == 1
    await advance(PAST)
    assert await reg.expire_leases() == LeaseExpiry()
    assert await reg.owner_of("s1") == "r2"


async def test_adopted_claims_expire_unless_renewed(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    result = await reg.register(WorkerInfo("a", 2), ["x", "y"], lease_s=SHORT)
    assert result.adopted == [Claim("a", "x"), Claim("a", "y")]
    assert await reg.owner_of("x") == ""
    await reg.renew("r1", ["y"], 60)  # a replica found y's browser
    await reg.request("q", ANY, owner="r1")
    await advance(PAST)
    assert await reg.expire_leases() == LeaseExpiry([Claim("a", "x")], [], [Claim("a", "q")])
    assert await sessions_of(reg) == {"a": ("y", "q")}


async def test_lease_expiry_mid_move_frees_both_claims(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    await reg.register(WorkerInfo("a", 1))
    await reg.request("s", ANY, owner="r1", lease_s=SHORT)
    await reg.register(WorkerInfo("b", 1))
    await reg.set_draining("a", True)
    assert (await reg.move("s", "a", lease_s=SHORT)).claim == Claim("b", "s")
    await advance(PAST)
    expiry = await reg.expire_leases()
    assert expiry.released == [Claim("b", "s"), Claim("a", "s")]
    assert await sessions_of(reg) == {"a": (), "b": ()}


# -- queue scores --------------------------------------------------------------------------------


async def test_queue_scores_and_requeue_at_a_given_score(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    first = await registry.request("s1", ANY)
    second = await registry.request("s2", ANY)
    assert first.queued_at is not None and second.queued_at is not None
    assert first.queued_at <= second.queued_at  # µs of arrival, Redis's time for Redis
    assert first.queued_at > 1_600_000_000 * 10**6
    # a replica re-queueing after Redis lost its data gives the old score back: the old place
    back = await registry.request("old", ANY, queued_at=first.queued_at - 1)
    assert (back.position, back.queued_at) == (1, first.queued_at - 1)
    assert await registry.request("old", ANY, queued_at=1) == back  # queued: unchanged
    tie = await registry.request("aa", ANY, queued_at=first.queued_at - 1)
    assert tie.position == 1  # the same score: by session id
    assert await registry.queue() == ["aa", "old", "s1", "s2"]
    # a slot that fits is taken at once, whatever the score
    await registry.register(WorkerInfo("b", 1, labels=("gpu",)))
    assert await registry.queue() == ["old", "s1", "s2"]  # aa took it: the first in order
    with pytest.raises(ValueError):
        await registry.request("bad", ANY, queued_at=2**60)


# -- park ------------------------------------------------------------------------------------


async def test_park_and_unpark_keep_the_place(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    for s in ("s1", "s2", "s3"):
        await registry.request(s, ANY)
    assert await registry.park("s1") is True
    assert await registry.park("s1") is True  # parked it is
    assert await registry.park("s0") is False  # holds a claim: not waiting
    assert await registry.park("nobody") is False
    assert await registry.position("s1") is None
    assert await registry.queue() == ["s2", "s3"]
    assert await registry.release(Claim("a", "s0")) == [Claim("a", "s2")]  # s1 skipped
    assert await registry.unpark("s1") == []
    assert await registry.unpark("s1") == []
    assert await registry.queue() == ["s1", "s3"]  # its old place: ahead of s3
    assert await registry.release(Claim("a", "s2")) == [Claim("a", "s1")]
    # a slot that frees while the only waiting session is parked: it gets it when back
    await registry.park("s3")
    assert await registry.release(Claim("a", "s1")) == []
    assert await free_slots(registry) == 1
    assert await registry.unpark("s3") == [Claim("a", "s3")]


async def test_a_parked_session_asking_again_is_unparked(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    await registry.request("s1", ANY)
    await registry.request("s2", ANY)
    await registry.park("s1")
    again = await registry.request("s1", ANY)
    assert again.position == 1
    await registry.park("s1")
    await registry.park("s2")
    await registry.release(Claim("a", "s0"))
    assert await free_slots(registry) == 1
    assert (await registry.request("s2", ANY)).claim == Claim("a", "s2")
    assert await registry.cancel("s1") is True  # cancel takes a parked session out too
    assert await registry.unpark("s1") == []


# -- withdraw ----------------------------------------------------------------------------------


async def test_withdraw(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    await registry.request("s1", ANY, owner="r1")
    await registry.request("s2", ANY)
    assert await registry.withdraw("s2") == Withdrawn(was_waiting=True)
    assert await registry.withdraw("s2") == Withdrawn(was_waiting=False)
    assert await registry.owner_of("s2") is None
    # s0 is released elsewhere, s1 is given its slot as its browser leaves: withdraw frees it
    assert await registry.release(Claim("a", "s0")) == [Claim("a", "s1")]
    assert await registry.cancel("s1") is False  # the old way: the slot would be lost
    assert await registry.withdraw("s1") == Withdrawn(False, Claim("a", "s1"))
    assert await free_slots(registry) == 1
    assert await registry.worker_of("s1") is None
    assert await registry.withdraw("nobody") == Withdrawn(False)


async def test_withdraw_a_claim_serves_the_queue(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    await registry.request("s1", ANY)
    assert await registry.withdraw("s0") == Withdrawn(False, Claim("a", "s0"), [Claim("a", "s1")])


async def old_end(reg: Registry, session: str) -> None:
    """How a session ended before `withdraw`: out of the queue; a claim it did not know it had
    just been given (the release was another replica's) stays."""
    await reg.cancel(session)


async def new_end(reg: Registry, session: str) -> None:
    withdrawn = await reg.withdraw(session)
    assert withdrawn.was_waiting or withdrawn.released is not None


@pytest.mark.parametrize(
    "end_session",
    [
        new_end,
        pytest.param(old_end, marks=pytest.mark.xfail(strict=True, reason="the slots are lost")),
    ],
)
async def test_a_burst_of_leaving_sessions_as_slots_free(
    registry: Registry, end_session: Callable[[Registry, str], Awaitable[None]]
) -> None:
    """60 queued sessions end in a burst while the two holders release their slots: each slot
    goes to the head of the queue, whose session is ending. No slot may be lost."""
    await registry.register(WorkerInfo("a", 2))
    await registry.request("h0", ANY)
    await registry.request("h1", ANY)
    queued = [f"q{i:02d}" for i in range(60)]
    for s in queued:
        await registry.request(s, ANY)
    # the releases first, the queue's tail first: the head is still waiting when the slots free
    await asyncio.gather(
        registry.release(Claim("a", "h0")),
        registry.release(Claim("a", "h1")),
        *(end_session(registry, s) for s in reversed(queued)),
    )
    assert await registry.queue() == []
    assert await sessions_of(registry) == {"a": ()}  # no claim without a waiting session
    assert await free_slots(registry) == 2


async def test_withdraw_under_two_replicas(redis_url: str) -> None:
    """Two replicas: sessions end and holders release at random, all at once; every slot is
    free at the end, and the data model holds."""
    prefix = fresh_prefix()
    replicas = [await RedisRegistry.connect(redis_url, prefix) for _ in range(2)]
    try:
        await replicas[0].register(WorkerInfo("a", 3))
        await replicas[1].register(WorkerInfo("b", 2))
        sessions = [f"s{i:03d}" for i in range(80)]
        for i, s in enumerate(sessions):
            await replicas[i % 2].request(s, ANY, owner=f"r{i % 2}")
        rng = random.Random(5)
        order = sessions[:]
        rng.shuffle(order)
        results = await asyncio.gather(*(rng.choice(replicas).withdraw(s) for s in order))
        assert sum(r.released is not None for r in results) == 5 + sum(
            len(r.served) for r in results
        )
        await check_invariant(replicas[0], redis_url)
        assert await sessions_of(replicas[1]) == {"a": (), "b": ()}
        assert await replicas[0].queue() == []
    finally:
        for reg in replicas:
            await reg.close()


# -- what workers report ------------------------------------------------------------------------


async def test_heartbeat_reconciles_after_the_grace(timed: tuple[Registry, Advance]) -> None:
    reg, advance = timed
    await reg.register(WorkerInfo("a", 2))
    await reg.request("s0", ANY)
    await reg.request("s1", ANY)  # claimed: the worker has not opened it yet
    await reg.request("q", ANY)
    plain = await reg.heartbeat("a", {"fps": 1})
    assert plain and (plain.stray, plain.released, plain.served) == ([], [], [])
    early = await reg.heartbeat("a", {}, ["s0", "x"], claim_grace_s=SHORT)
    assert (early.known, early.stray, early.released, early.served) == (True, ["x"], [], [])
    await advance(PAST)
    late = await reg.heartbeat("a", {}, ["s0", "x", "x"], claim_grace_s=SHORT)
    assert late.stray == ["x"]
    assert late.released == [Claim("a", "s1")]
    assert late.served == [Claim("a", "q")]
    # q was claimed just now: not freed although the worker does not serve it yet
    again = await reg.heartbeat("a", {}, ["s0"], claim_grace_s=SHORT)
    assert (again.stray, again.released) == ([], [])
    assert await sessions_of(reg) == {"a": ("s0", "q")}
    assert (await reg.heartbeat("gone", {}, ["s0"])).known is False
    [status] = await reg.workers()
    assert status.load == {}


async def test_register_adopts_and_names_strays(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)  # on a
    await registry.request("q0", ANY)  # waiting
    await registry.request("p0", ANY)
    await registry.park("p0")
    result = await registry.register(
        WorkerInfo("b", 1), ["s0", "q0", "new1", "p0", "new2", "new1"], lease_s=60
    )
    assert result.stray == ["s0", "q0", "p0", "new2"]  # placed elsewhere, or over its slots
    assert result.adopted == [Claim("b", "new1")]
    assert result.served == []
    assert await registry.worker_of("new1") == "b"
    assert (await registry.owner_of("new1"), await registry.worker_of("s0")) == ("", "a")
    # registering again (another replica, or Redis lost its data): what it holds is kept
    again = await registry.register(WorkerInfo("b", 2), ["new1"])
    assert (again.stray, again.adopted, again.served) == ([], [], [Claim("b", "q0")])
    assert await sessions_of(registry) == {"a": ("s0",), "b": ("new1", "q0")}
    # sessions it does not report are left to the heartbeat's reconciliation
    assert (await registry.register(WorkerInfo("b", 2), [])).stray == []
    assert await sessions_of(registry) == {"a": ("s0",), "b": ("new1", "q0")}


async def test_register_adopts_on_a_draining_worker(registry: Registry) -> None:
    result = await registry.register(WorkerInfo("a", 2, draining=True), ["x"])
    assert result.adopted == [Claim("a", "x")]
    assert (await registry.request("y", ANY)).position == 1


# -- draining ------------------------------------------------------------------------------------


async def test_draining_workers_get_no_new_claims(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2, labels=("gpu",), draining=True, instance="i1"))
    await registry.register(WorkerInfo("b", 1))
    assert (await registry.request("s0", ANY)).claim == Claim("b", "s0")
    assert (await registry.request("s1", ANY)).position == 1
    # only a draining worker fits: no worker that could serve it is counted
    refused = await registry.request("g", GPU, refuse_unservable=True)
    assert refused.unservable and await registry.queue() == ["s1"]
    info = {w.info.worker_id: w.info for w in await registry.workers()}
    assert info["a"].draining and not info["b"].draining and info["a"].instance == "i1"
    # the same process registering again (another replica) stays draining
    assert (
        await registry.register(WorkerInfo("a", 2, labels=("gpu",), instance="i1"))
    ).served == []
    assert (await registry.set_draining("nobody", True)).known is False
    undrained = await registry.set_draining("a", False)
    assert undrained and undrained.served == [Claim("a", "s1")]
    assert (await registry.request("g", GPU, refuse_unservable=True)).claim == Claim("a", "g")
    assert await registry.set_draining("a", True)
    assert (await registry.request("s2", ANY)).position == 1
    # a new process of the worker (a new instance) is not draining
    result = await registry.register(WorkerInfo("a", 3, labels=("gpu",), instance="i2"))
    assert result.served == [Claim("a", "s2")]


async def test_all_draining_queues_rather_than_refuses(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2, draining=True))
    ticket = await registry.request("s", GPU, refuse_unservable=True)
    assert (ticket.unservable, ticket.position) == (False, 1)


# -- moves ---------------------------------------------------------------------------------------


async def test_move_keeps_the_requirements(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2))
    await registry.request("s0", GPU)  # nobody fits yet
    await registry.register(WorkerInfo("g", 2, labels=("gpu",)))
    await registry.register(WorkerInfo("b", 2))
    assert await registry.worker_of("s0") == "g"
    assert await registry.set_draining("g", True)
    moved = await registry.move("s0", "g")  # b is free but does not fit: it waits
    assert (moved.claim, moved.position) == (None, 1)
    result = await registry.register(WorkerInfo("g2", 1, labels=("gpu",)))
    assert result.served == [Claim("g2", "s0")]
    assert await registry.holds("g", "s0") and await registry.worker_of("s0") == "g2"


async def test_move(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2))
    await registry.request("s0", ANY, owner="r1")
    await registry.request("s1", ANY, owner="r1")
    await registry.register(WorkerInfo("b", 1))
    assert await registry.set_draining("a", True)
    moved = await registry.move("s0", "a")
    assert moved == Ticket("s0", claim=Claim("b", "s0"))
    assert await registry.owner_of("s0") == "r1"  # owner "" keeps it
    assert await registry.holds("a", "s0") and await registry.holds("b", "s0")
    assert await registry.worker_of("s0") == "b"
    assert await registry.request("s0", ANY) == Ticket("s0", claim=Claim("b", "s0"))
    assert await sessions_of(registry) == {"a": ("s0", "s1"), "b": ("s0",)}
    # no free slot fits: it waits ahead of every arrival, and is served first
    await registry.request("q0", ANY)
    ahead = await registry.move("s1", "a", owner="r2")
    assert ahead.position == 1 and ahead.claim is None
    assert ahead.queued_at is not None and ahead.queued_at < 10**15
    assert await registry.move("s1", "a") == ahead  # asked again: the same place
    assert await registry.owner_of("s1") == "r2"
    assert await registry.queue() == ["s1", "q0"]
    assert await registry.worker_of("s1") == "a"  # still held where it runs
    # the old worker reports s0 closed: its old claim goes, the holder stays
    assert await registry.release(Claim("a", "s0")) == []  # a is draining: serves nobody
    assert await registry.worker_of("s0") == "b" and not await registry.holds("a", "s0")
    assert await registry.release(Claim("b", "s0")) == [Claim("b", "s1")]
    assert await registry.holds("a", "s1") and await registry.worker_of("s1") == "b"
    # not held by the worker named: nothing done
    assert await registry.move("s1", "a") == Ticket("s1")
    assert await registry.move("nobody", "a") == Ticket("nobody")
    assert await registry.move("q0", "a") == Ticket("q0")
    assert await sessions_of(registry) == {"a": ("s1",), "b": ("s1",)}


async def test_release_and_unregister_only_what_the_worker_holds(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s", ANY)
    await registry.register(WorkerInfo("b", 1))
    await registry.set_draining("a", True)
    await registry.move("s", "a")
    assert await registry.unregister("a") == []  # s had moved away: only dropped from its set
    assert await registry.worker_of("s") == "b"
    assert await registry.unregister("b") == [Claim("b", "s")]
    assert await registry.worker_of("s") is None
    # expire too
    await registry.register(WorkerInfo("a", 1))
    await registry.request("t", ANY)
    await registry.register(WorkerInfo("b", 1))
    await registry.set_draining("a", True)
    await registry.move("t", "a")
    await registry.heartbeat("b", {})
    assert await registry.expire(-1e6) == {"a": [], "b": [Claim("b", "t")]}


async def test_withdraw_mid_move_releases_both_claims(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s", ANY)
    await registry.register(WorkerInfo("b", 1))
    await registry.set_draining("a", True)
    await registry.move("s", "a")
    await registry.request("q", ANY)
    withdrawn = await registry.withdraw("s")
    assert withdrawn == Withdrawn(False, Claim("b", "s"), [Claim("b", "q")], [Claim("a", "s")])
    assert await sessions_of(registry) == {"a": (), "b": ("q",)}


async def test_a_retried_call_answers_what_the_first_one_did(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from render_server.signaling.state import redis_registry

    reg = await RedisRegistry.connect(redis_url, fresh_prefix())
    try:
        await reg.register(WorkerInfo("a", 1))
        await reg.request("s0", ANY)
        await reg.request("s1", ANY)

        def call_id(value: uuid.UUID) -> None:  # every call, the same id: as a retry sends it
            monkeypatch.setattr(redis_registry, "uuid", type("U", (), {"uuid4": lambda: value}))

        call_id(uuid.uuid4())
        first = await reg.withdraw("s0")
        assert (
            first
            == await reg.withdraw("s0")
            == Withdrawn(False, Claim("a", "s0"), [Claim("a", "s1")])
        )
        monkeypatch.undo()
        await reg.register(WorkerInfo("b", 1))
        await reg.set_draining("a", True)
        call_id(uuid.uuid4())
        assert (
            await reg.move("s1", "a") == await reg.move("s1", "a") == Ticket("s1", Claim("b", "s1"))
        )
        monkeypatch.undo()
        call_id(uuid.uuid4())
        beat = await reg.heartbeat("a", {}, [], claim_grace_s=-1)
        assert beat == await reg.heartbeat("a", {}, [], claim_grace_s=-1)
        assert beat.released == [Claim("a", "s1")]
    finally:
        await reg.close()
