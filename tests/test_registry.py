"""The registry rules (registry.py) on both implementations, the Redis one under concurrency,
and the message bus between replicas (both implementations).

Redis tests run against a real redis-server (tests/redis_server.py); without one they fail.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from render_server.protocol.requirements import Requirements
from render_server.signaling.state.bus import (
    Bus,
    MemoryBus,
    MemoryHub,
    Message,
    RedisBus,
    connect_bus,
)
from render_server.signaling.state.redis_registry import (
    FITS_LUA,
    RedisRegistry,
    _info_json,
    connect_registry,
)
from render_server.signaling.state.registry import (
    Claim,
    MemoryRegistry,
    RegisterResult,
    Registry,
    Ticket,
    WorkerInfo,
    check_requirements,
    check_worker,
)

from .redis_server import fresh_prefix, running_redis

ANY = Requirements()


@pytest.fixture(params=["memory", "redis"])
async def registry(request: pytest.FixtureRequest) -> AsyncIterator[Registry]:
    reg: Registry
    if request.param == "memory":
        reg = MemoryRegistry()
    else:
        reg = await RedisRegistry.connect(request.getfixturevalue("redis_url"), fresh_prefix())
    yield reg
    await reg.close()


async def sessions_of(reg: Registry) -> dict[str, tuple[str, ...]]:
    return {w.info.worker_id: w.sessions for w in await reg.workers()}


# -- the rules, on both implementations ----------------------------------------------------------


async def test_register_replace_keeps_sessions(registry: Registry) -> None:
    assert (await registry.register(WorkerInfo("a", 2, {"codecs": ["H264"]}))).served == []
    claim = (await registry.request("s1", ANY)).claim
    assert claim == Claim("a", "s1")
    await registry.register(WorkerInfo("a", 3, {"codecs": ["AV1"]}, labels=("gpu",)))
    [status] = await registry.workers()
    assert status.info == WorkerInfo("a", 3, {"codecs": ["AV1"]}, labels=("gpu",))
    assert status.sessions == ("s1",)
    assert status.free == 2
    assert await registry.worker_of("s1") == "a"


async def test_least_loaded_choice_and_ties(registry: Registry) -> None:
    await registry.register(WorkerInfo("b", 2))
    await registry.register(WorkerInfo("a", 4))
    picks = [(await registry.request(f"s{i}", ANY)).claim for i in range(6)]
    # a (0/4 = 0/2, 4 free > 2); b (0/2 < 1/4); a (1/4 < 1/2); a (2/4 = 1/2, 2 free > 1);
    # b (1/2 < 3/4); a (b is full)
    assert [c.worker_id for c in picks if c] == ["a", "b", "a", "a", "b", "a"]
    # equal workers: the lower id, whatever the registration order
    await registry.register(WorkerInfo("z", 1))
    await registry.register(WorkerInfo("y", 1))
    assert (await registry.request("t", ANY)).claim == Claim("y", "t")


async def test_requirements_matching(registry: Registry) -> None:
    await registry.register(
        WorkerInfo("big", 1, {"codecs": ["H264", "AV1"], "resolution": "3840x2160"}, ("gpu",), "eu")
    )
    await registry.register(WorkerInfo("small", 1, {"codecs": ["H264"], "resolution": "1280x720"}))
    fits_small = Requirements(codec="H264", resolution="1280X720")
    wants_big = Requirements(frozenset({"gpu"}), "eu", "AV1", "1920x1080")
    assert (await registry.request("s1", fits_small)).claim == Claim("big", "s1")  # big first
    assert (await registry.request("s2", wants_big)).position == 1
    assert (await registry.request("s3", Requirements(region="us"))).position == 2
    assert (await registry.request("s4", Requirements(resolution="1281x720"))).position == 3
    assert (await registry.request("s5", fits_small)).claim == Claim("small", "s5")
    assert await registry.release(Claim("big", "s1")) == [Claim("big", "s2")]
    assert await registry.queue() == ["s3", "s4"]


async def test_queue_fifo_and_positions(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    assert (await registry.request("s0", ANY)).claim == Claim("a", "s0")
    for i in range(1, 4):
        ticket = await registry.request(f"s{i}", ANY)
        assert (ticket.claim, ticket.position) == (None, i)
    assert (await registry.request("s2", ANY)).position == 2  # asked again: same place
    assert await registry.queue() == ["s1", "s2", "s3"]
    assert [await registry.position(s) for s in ("s0", "s1", "s3", "nobody")] == [None, 1, 3, None]


async def test_request_again_keeps_the_one_claim(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.register(WorkerInfo("b", 1))
    first = await registry.request("s", ANY)
    again = await registry.request("s", ANY)
    assert again.claim == first.claim
    assert sum(len(s) for s in (await sessions_of(registry)).values()) == 1


async def test_cancel(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    for i in range(1, 4):
        await registry.request(f"s{i}", ANY)
    assert await registry.cancel("s2") is True
    assert await registry.cancel("s2") is False
    assert await registry.cancel("s0") is False  # holds a slot: not waiting
    assert await registry.queue() == ["s1", "s3"]
    assert await registry.position("s3") == 2
    assert await registry.release(Claim("a", "s0")) == [Claim("a", "s1")]


async def test_release_serves_in_order_and_skips_what_does_not_fit(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.register(WorkerInfo("b", 1))
    await registry.request("s0", ANY)
    await registry.request("s1", ANY)
    await registry.request("needs-x", Requirements(labels=frozenset({"x"})))
    await registry.request("q1", ANY)
    await registry.request("q2", ANY)
    assert await registry.release(Claim("a", "s0")) == [Claim("a", "q1")]
    assert await registry.queue() == ["needs-x", "q2"]  # it keeps its place
    assert await registry.position("needs-x") == 1
    # a worker that fits arrives: registration serves the queue too
    served = (await registry.register(WorkerInfo("x", 1, labels=("x",)))).served
    assert served == [Claim("x", "needs-x")]
    assert await registry.release(Claim("b", "s1")) == [Claim("b", "q2")]
    assert await registry.queue() == []


async def test_double_release_frees_nothing(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2))
    claim = (await registry.request("s0", ANY)).claim
    assert claim is not None
    await registry.request("s1", ANY)
    await registry.request("s2", ANY)
    assert await registry.release(claim) == [Claim("a", "s2")]
    assert await registry.release(claim) == []
    assert await registry.release(Claim("a", "nobody")) == []
    assert await registry.release(Claim("gone", "s1")) == []
    assert await sessions_of(registry) == {"a": ("s1", "s2")}


async def test_unregister_returns_claims(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 2))
    await registry.register(WorkerInfo("b", 1))
    for i in range(3):
        await registry.request(f"s{i}", ANY)
    assert await registry.unregister("a") == [Claim("a", "s0"), Claim("a", "s2")]
    assert await registry.unregister("a") == []
    assert await registry.worker_of("s0") is None
    assert await registry.release(Claim("a", "s0")) == []
    assert await sessions_of(registry) == {"b": ("s1",)}
    # a worker that comes back starts empty
    await registry.register(WorkerInfo("a", 2))
    assert await sessions_of(registry) == {"b": ("s1",), "a": ()}


async def test_heartbeat_and_expire(registry: Registry) -> None:
    await registry.register(WorkerInfo("old", 1))
    await registry.request("s-old", ANY)
    await asyncio.sleep(0.3)
    await registry.register(WorkerInfo("new", 1))
    assert (await registry.heartbeat("new", {"fps": 60})).known is True
    assert (await registry.heartbeat("unknown", {})).known is False
    assert not await registry.heartbeat("unknown", {})  # old callers test it as a bool
    assert await registry.expire(10.0) == {}
    assert await registry.expire(0.15) == {"old": [Claim("old", "s-old")]}
    [status] = await registry.workers()
    assert (status.info.worker_id, status.load) == ("new", {"fps": 60})
    assert not await registry.heartbeat("old", {})  # it must register again
    assert await registry.worker_of("s-old") is None
    assert await registry.expire(-1.0) == {"new": []}
    assert await registry.workers() == []


async def test_last_seen_moves_with_heartbeats(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    [before] = await registry.workers()
    await asyncio.sleep(0.02)
    await registry.heartbeat("a", {})
    [after] = await registry.workers()
    assert 0.01 < after.last_seen - before.last_seen < 5


async def test_worker_of(registry: Registry) -> None:
    await registry.register(WorkerInfo("a", 1))
    await registry.request("s0", ANY)
    await registry.request("s1", ANY)
    assert await registry.worker_of("s0") == "a"
    assert await registry.worker_of("s1") is None  # waiting
    assert await registry.worker_of("nobody") is None


@pytest.mark.parametrize(
    "requirements",
    [
        Requirements(resolution="big"),
        Requirements(resolution="1920x1080x2"),
        Requirements(resolution=" 1920x1080"),
        Requirements(resolution="１920x1080"),
        Requirements(labels=frozenset({1})),  # type: ignore[arg-type]
    ],
)
async def test_malformed_requirements_are_refused(
    registry: Registry, requirements: Requirements
) -> None:
    """Queued, a request `fits` cannot judge would make every later release fail."""
    await registry.register(WorkerInfo("a", 0))
    with pytest.raises(ValueError):
        await registry.request("s", requirements)
    assert await registry.queue() == []


@pytest.mark.parametrize(
    "info",
    [
        WorkerInfo("a", 1, {"resolution": None}),
        WorkerInfo("a", 1, {"resolution": "wide"}),
        WorkerInfo("a", 1, {"codecs": "H264"}),
        WorkerInfo("a", True),
        WorkerInfo("a", -1),
        WorkerInfo("a", 1, {"fps": float("nan")}),
        WorkerInfo("", 1),
    ],
)
async def test_malformed_workers_are_refused(registry: Registry, info: WorkerInfo) -> None:
    with pytest.raises(ValueError):
        await registry.register(info)
    assert await registry.workers() == []


# -- Requirements.fits and its Lua twin agree --------------------------------------------------

NAMES = st.sampled_from(["gpu", "x", "eu", "", "é", "a b"])
RESOLUTIONS = st.one_of(
    st.sampled_from(["1280x720", "1920x1080", "3840x2160", "0x0", "1920X1080", "0720x0480"]),
    st.from_regex(r"[0-9]{1,9}[xX][0-9]{1,9}", fullmatch=True),
)
REGIONS = st.none() | st.sampled_from(["eu", "us", "EU", ""])
CODECS = st.sampled_from(["H264", "AV1", "h264", ""])
CAPABILITIES = st.fixed_dictionaries(
    {},
    optional={
        "codecs": st.lists(CODECS, max_size=3),
        "resolution": RESOLUTIONS,
        "fps": st.floats(allow_nan=False, allow_infinity=False),
        "gpu": st.none() | st.text(max_size=5),
    },
)
WORKER_INFOS = st.builds(
    WorkerInfo,
    worker_id=st.text(min_size=1, max_size=5),
    slots=st.integers(0, 8),
    capabilities=CAPABILITIES,
    labels=st.lists(NAMES, max_size=3).map(tuple),
    region=REGIONS,
)
REQUIREMENTS = st.builds(
    Requirements,
    labels=st.frozensets(NAMES, max_size=2),
    region=REGIONS,
    codec=st.none() | CODECS,
    resolution=st.none() | RESOLUTIONS,
    codecs=st.lists(CODECS, max_size=3).map(tuple),
)


def test_lua_fits_agrees_with_python(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    probe = client.register_script(
        FITS_LUA + "\nreturn fits(cjson.decode(ARGV[1]), cjson.decode(ARGV[2])) and 1 or 0"
    )

    @settings(max_examples=400, deadline=None)
    @given(REQUIREMENTS, WORKER_INFOS)
    def agree(requirements: Requirements, info: WorkerInfo) -> None:
        check_requirements(requirements)
        check_worker(info)
        lua = probe(args=[json.dumps(requirements.as_dict()), _info_json(info)])
        assert bool(lua) == requirements.fits(info)

    try:
        agree()
    finally:
        client.close()


# -- MemoryRegistry and RedisRegistry give the same answers -------------------------------------

WORKER_IDS = st.sampled_from(["a", "b", "c", "ab"])
SESSION_IDS = st.sampled_from([f"s{i}" for i in range(10)])
SMALL_REQUIREMENTS = st.sampled_from(
    [
        ANY,
        ANY,
        ANY,
        Requirements(labels=frozenset({"gpu"})),
        Requirements(region="eu"),
        Requirements(codec="AV1"),
        Requirements(codecs=("VP8", "AV1")),
        Requirements(resolution="1920x1080"),
        Requirements(frozenset({"x"}), "eu", "H264", "3840x2160"),
    ]
)
SMALL_WORKERS = st.builds(
    WorkerInfo,
    worker_id=WORKER_IDS,
    slots=st.sampled_from([1, 1, 2, 2, 3, 0]),
    capabilities=st.fixed_dictionaries(
        {
            "codecs": st.lists(st.sampled_from(["H264", "AV1"]), max_size=2, unique=True),
            "resolution": st.sampled_from(["1920x1080", "3840x2160", "640x480"]),
        }
    ),
    labels=st.lists(st.sampled_from(["gpu", "x"]), max_size=2, unique=True).map(tuple),
    region=st.none() | st.just("eu"),
    draining=st.sampled_from([False, False, False, True]),
    instance=st.sampled_from(["", "i1"]),
)


LEASES = st.sampled_from([1e6, 1e6, 1e6, -1.0])  # -1: ended already (no real time in here)
OWNERS = st.sampled_from(["", "r1", "r2"])
SCORES = st.sampled_from([None, None, None, 5, 5, 7])  # given back: ahead of every arrival
SESSION_LISTS = st.lists(SESSION_IDS, max_size=4)


def comparable(answer: Any) -> Any:
    """An answer without the times that differ between the two clocks: a queue score that is a
    time (not one given back in `request`) reads -1."""
    if isinstance(answer, Ticket) and answer.queued_at is not None and answer.queued_at > 100:
        return dataclasses.replace(answer, queued_at=-1)
    return answer


class SameAnswers(RuleBasedStateMachine):
    """Random operations on MemoryRegistry and on RedisRegistry (two instances, as two replicas,
    taking turns): every answer and the state after it agree."""

    url = ""
    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.memory = MemoryRegistry()
        prefix = fresh_prefix()
        self.replicas = [
            self.loop.run_until_complete(RedisRegistry.connect(self.url, prefix)) for _ in "ab"
        ]
        self.turn = 0

    def both(self, op: Callable[[Registry], Awaitable[Any]]) -> Any:
        expected = self.loop.run_until_complete(op(self.memory))
        self.turn += 1
        got = self.loop.run_until_complete(op(self.replicas[self.turn % 2]))
        assert comparable(got) == comparable(expected)
        return expected

    def teardown(self) -> None:
        for replica in self.replicas:
            self.loop.run_until_complete(replica.close())
        self.loop.close()

    def registered(self, info: WorkerInfo, sessions: list[str] = []) -> list[Claim]:  # noqa: B006
        result: RegisterResult = self.both(lambda r: r.register(info, sessions))
        return result.served + result.adopted

    @initialize(target=claims, infos=st.lists(SMALL_WORKERS, max_size=3))
    def start(self, infos: list[WorkerInfo]) -> Any:
        return multiple(*[claim for info in infos for claim in self.registered(info)])

    @rule(target=claims, info=SMALL_WORKERS, sessions=SESSION_LISTS)
    def register(self, info: WorkerInfo, sessions: list[str]) -> Any:
        return multiple(*self.registered(info, sessions))

    @rule(
        target=claims,
        session=SESSION_IDS,
        requirements=SMALL_REQUIREMENTS,
        refuse=st.booleans(),
        owner=OWNERS,
        lease_s=LEASES,
        queued_at=SCORES,
    )
    def request(
        self,
        session: str,
        requirements: Requirements,
        refuse: bool,
        owner: str,
        lease_s: float,
        queued_at: int | None,
    ) -> Any:
        ticket = self.both(
            lambda r: r.request(session, requirements, refuse, owner, lease_s, queued_at)
        )
        return multiple(*([ticket.claim] if ticket.claim else []))

    @rule(target=claims, claim=consumes(claims))
    def release(self, claim: Claim) -> Any:
        return multiple(*self.both(lambda r: r.release(claim)))

    @rule(target=claims, worker=WORKER_IDS, session=SESSION_IDS)
    def release_anything(self, worker: str, session: str) -> Any:
        return multiple(*self.both(lambda r: r.release(Claim(worker, session))))

    @rule(session=SESSION_IDS)
    def cancel(self, session: str) -> None:
        self.both(lambda r: r.cancel(session))

    @rule(target=claims, session=SESSION_IDS)
    def withdraw(self, session: str) -> Any:
        return multiple(*self.both(lambda r: r.withdraw(session)).served)

    @rule(session=SESSION_IDS)
    def park(self, session: str) -> None:
        self.both(lambda r: r.park(session))

    @rule(target=claims, session=SESSION_IDS)
    def unpark(self, session: str) -> Any:
        return multiple(*self.both(lambda r: r.unpark(session)))

    @rule(owner=OWNERS, sessions=SESSION_LISTS, lease_s=LEASES)
    def renew(self, owner: str, sessions: list[str], lease_s: float) -> None:
        self.both(lambda r: r.renew(owner, sessions, lease_s))

    @rule(target=claims)
    def expire_leases(self) -> Any:
        return multiple(*self.both(lambda r: r.expire_leases()).served)

    @rule(target=claims, worker=WORKER_IDS, draining=st.booleans())
    def set_draining(self, worker: str, draining: bool) -> Any:
        return multiple(*self.both(lambda r: r.set_draining(worker, draining)).served)

    @rule(target=claims, claim=claims, owner=OWNERS)
    def move(self, claim: Claim, owner: str) -> Any:
        ticket = self.both(lambda r: r.move(claim.session_id, claim.worker_id, owner))
        return multiple(*([ticket.claim] if ticket.claim else []))

    @rule(target=claims, session=SESSION_IDS, worker=WORKER_IDS)
    def move_anything(self, session: str, worker: str) -> Any:
        ticket = self.both(lambda r: r.move(session, worker))
        return multiple(*([ticket.claim] if ticket.claim else []))

    @rule(worker=WORKER_IDS, n=st.integers(0, 3))
    def heartbeat(self, worker: str, n: int) -> None:
        self.both(lambda r: r.heartbeat(worker, {"sessions": n, "fps": [60.0] * n}))

    @rule(
        target=claims,
        worker=WORKER_IDS,
        sessions=SESSION_LISTS,
        grace_s=st.sampled_from([1e6, -1.0]),  # -1: every claim it does not serve is freed
    )
    def reconcile(self, worker: str, sessions: list[str], grace_s: float) -> Any:
        result = self.both(lambda r: r.heartbeat(worker, {}, sessions, grace_s))
        return multiple(*result.served)

    @rule(worker=WORKER_IDS)
    def unregister(self, worker: str) -> None:
        self.both(lambda r: r.unregister(worker))

    @rule(timeout_s=st.sampled_from([1e6, 1e6, 1e6, -1e6]))  # -1e6: every worker expires
    def expire(self, timeout_s: float) -> None:
        self.both(lambda r: r.expire(timeout_s))

    @rule(session=SESSION_IDS, worker=WORKER_IDS)
    def look_up(self, session: str, worker: str) -> None:
        self.both(lambda r: r.worker_of(session))
        self.both(lambda r: r.position(session))
        self.both(lambda r: r.owner_of(session))
        self.both(lambda r: r.holds(worker, session))

    @rule()
    def redis_is_consistent(self) -> None:
        self.loop.run_until_complete(check_invariant(self.replicas[0], self.url))

    @invariant()
    def same_state(self) -> None:
        self.both(lambda r: r.queue())

        async def snapshot(r: Registry) -> list[tuple[Any, ...]]:
            return [(w.info, w.sessions, w.load) for w in await r.workers()]

        self.both(snapshot)


@pytest.mark.timeout(900)  # passing takes seconds; a failure is shrunk, which takes minutes
def test_memory_and_redis_give_the_same_answers(redis_url: str) -> None:
    SameAnswers.url = redis_url
    run_state_machine_as_test(
        SameAnswers,
        settings=settings(
            max_examples=300,  # many rules: more runs to meet the rarer states
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# -- two replicas at once ---------------------------------------------------------------------


async def check_invariant(reg: RedisRegistry, redis_url: str) -> tuple[dict[str, str], list[str]]:
    """Σ sessions ≤ slots on every worker (unless it re-registered with fewer); a session is in
    the set of its holder and of the workers it moves away from, none other; the counts, the
    free set, the leases match. Returns session -> holder, and the queue."""
    statuses = await reg.workers()
    queue = await reg.queue()
    sets: dict[str, list[str]] = {}  # session -> the workers whose sets hold it
    for status in statuses:
        for session in status.sessions:
            sets.setdefault(session, []).append(status.info.worker_id)
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    base = f"{{{reg.prefix}}}:"
    try:
        index, used, moved, wants, owner = [
            await raw.hgetall(base + name) for name in ("holder", "used", "moved", "wants", "owner")
        ]
        free = await raw.zrange(base + "free", 0, -1)
        parked = await raw.zrange(base + "parked", 0, -1)
        leased = await raw.zrange(base + "lease", 0, -1)
        draining = await raw.smembers(base + "draining")
    finally:
        await raw.aclose()
    for session, workers in sets.items():
        expected = ([index[session]] if session in index else []) + json.loads(
            moved.get(session, "[]")
        )
        assert sorted(workers) == sorted(expected), (session, workers, expected)
    assert set(index) | set(moved) == set(sets)
    ids = {status.info.worker_id for status in statuses}
    assert set(used) <= ids and draining <= ids
    for status in statuses:
        assert int(used.get(status.info.worker_id, 0)) == len(status.sessions)
        assert status.info.draining == (status.info.worker_id in draining)
    assert sorted(free) == sorted(
        s.info.worker_id for s in statuses if s.free > 0 and not s.info.draining
    )
    assert not set(queue) & set(parked)
    known = set(sets) | set(queue) | set(parked)
    assert set(leased) == set(owner) == set(wants) == known
    return index, queue


async def test_two_replicas_200_requests(redis_url: str) -> None:
    prefix = fresh_prefix()
    replicas = [await RedisRegistry.connect(redis_url, prefix) for _ in range(2)]
    try:
        slots = {"w1": 3, "w2": 4, "w3": 5}
        for worker, n in slots.items():
            await replicas[0].register(WorkerInfo(worker, n))
        sessions = [f"s{i:03d}" for i in range(200)]
        tickets = await asyncio.gather(
            *(replicas[i % 2].request(s, ANY) for i, s in enumerate(sessions))
        )
        held, queue = await check_invariant(replicas[1], redis_url)
        assert held == {t.session_id: t.claim.worker_id for t in tickets if t.claim}
        assert len(held) == sum(slots.values())
        # the order of enqueueing is the order of the positions handed out
        places = sorted((t.position, t.session_id) for t in tickets if t.claim is None)
        assert [p for p, _ in places] == list(range(1, 201 - len(held)))
        arrival = [s for _, s in places]
        assert queue == arrival

        rng = random.Random(20)
        served: list[str] = []
        released: list[Claim] = []
        while held:
            batch = rng.sample(sorted(held), min(len(held), rng.randint(1, 5)))
            fresh = [Claim(held[s], s) for s in batch]
            again = rng.sample(released, min(len(released), rng.randint(0, 2)))
            results = await asyncio.gather(
                *(rng.choice(replicas).release(c) for c in fresh + again)
            )
            assert results[len(fresh) :] == [[]] * len(again), "a second release served someone"
            released += fresh
            # each release frees one slot, which the head of the queue takes, if any waits
            assert all(len(got) <= 1 for got in results), "one freed slot served two"
            assert sum(map(len, results)) == min(len(fresh), len(queue))
            for got in results[: len(fresh)]:
                for new in got:
                    assert new.session_id not in served
                    served.append(new.session_id)
            held, queue = await check_invariant(replicas[rng.randint(0, 1)], redis_url)
            # FIFO: those served so far are the head of the arrival order, the rest still wait
            assert sorted(served) == sorted(arrival[: len(served)])
            assert queue == arrival[len(served) :]
            if queue:
                assert len(held) == sum(slots.values())  # no waiting request fits a free slot
        assert sorted(served) == sorted(arrival)  # everyone was served in the end
    finally:
        for reg in replicas:
            await reg.close()


async def test_two_replicas_mixed_requirements(redis_url: str) -> None:
    prefix = fresh_prefix()
    replicas = [await RedisRegistry.connect(redis_url, prefix) for _ in range(2)]
    try:
        workers = [
            WorkerInfo("gpu-eu", 3, {"codecs": ["H264", "AV1"], "resolution": "3840x2160"},
                       ("gpu",), "eu"),
            WorkerInfo("gpu-us", 2, {"codecs": ["H264"], "resolution": "1920x1080"}, ("gpu",),
                       "us"),
            WorkerInfo("cpu", 4, {"codecs": ["H264"], "resolution": "1280x720"}),
        ]  # fmt: skip
        infos = {w.worker_id: w for w in workers}
        for w in workers:
            await replicas[1].register(w)
        kinds = [
            ANY,
            Requirements(labels=frozenset({"gpu"})),
            Requirements(region="eu"),
            Requirements(codec="AV1"),
            Requirements(resolution="1920x1080"),
            Requirements(region="mars"),  # fits nobody: waits for ever
        ]
        rng = random.Random(3)
        wants = {f"s{i:03d}": rng.choice(kinds) for i in range(200)}
        tickets = await asyncio.gather(
            *(replicas[i % 2].request(s, r) for i, (s, r) in enumerate(wants.items()))
        )
        arrival = [t.session_id for t in sorted(tickets, key=lambda t: t.position or 0) if
                   t.claim is None]  # fmt: skip

        async def check() -> tuple[dict[str, str], list[str]]:
            held, queue = await check_invariant(replicas[0], redis_url)
            free = {w: infos[w].slots for w in infos}
            for worker in held.values():
                free[worker] -= 1
            for session in queue:  # no waiting request fits a free slot
                assert not [w for w, n in free.items() if n and wants[session].fits(infos[w])]
            # FIFO within each kind of request: the earlier one of a kind is served first
            for kind in kinds:
                of_kind = [s for s in arrival if wants[s] == kind]
                waiting = [s for s in queue if wants[s] == kind]
                assert waiting == of_kind[len(of_kind) - len(waiting) :]
            return held, queue

        held, queue = await check()
        while held:
            batch = rng.sample(sorted(held), min(len(held), rng.randint(1, 4)))
            await asyncio.gather(*(rng.choice(replicas).release(Claim(held[s], s)) for s in batch))
            held, queue = await check()
        assert {wants[s] for s in queue} == {Requirements(region="mars")}
    finally:
        for reg in replicas:
            await reg.close()


async def test_a_retried_call_answers_what_the_first_one_did(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py sends a call again when the connection drops before the reply: the second run
    must not lose what the first freed or served."""
    from render_server.signaling.state import redis_registry

    reg = await RedisRegistry.connect(redis_url, fresh_prefix())
    try:
        await reg.register(WorkerInfo("a", 1))
        await reg.request("s0", ANY)
        await reg.request("s1", ANY)

        def call_id(value: uuid.UUID) -> None:  # every call, the same id: as a retry sends it
            monkeypatch.setattr(redis_registry, "uuid", type("U", (), {"uuid4": lambda: value}))

        call_id(uuid.uuid4())
        first = await reg.release(Claim("a", "s0"))
        assert first == await reg.release(Claim("a", "s0")) == [Claim("a", "s1")]
        call_id(uuid.uuid4())
        assert await reg.unregister("a") == await reg.unregister("a") == [Claim("a", "s1")]
        monkeypatch.undo()
        assert await reg.release(Claim("a", "s0")) == []  # a new call: nothing to free
    finally:
        await reg.close()


# -- factories -----------------------------------------------------------------------------------


async def test_connect_registry_and_bus(redis_url: str) -> None:
    memory = await connect_registry(None)
    assert isinstance(memory, MemoryRegistry)
    shared = await connect_registry(redis_url)
    assert isinstance(shared, RedisRegistry)
    await shared.close()
    assert isinstance(await connect_bus(None), MemoryBus)
    bus = await connect_bus(redis_url)
    assert isinstance(bus, RedisBus)
    await bus.close()
    for bad in ("http://localhost:6379", "localhost:6379", "unix:///tmp/redis.sock"):
        with pytest.raises(ValueError, match="redis://"):
            await connect_registry(bad)
        with pytest.raises(ValueError, match="redis://"):
            await connect_bus(bad)


async def test_connect_fails_clearly_without_redis() -> None:
    dead = "redis://:secret@127.0.0.1:1/0"
    with pytest.raises(ConnectionError, match=r"redis://:\*\*\*@127.0.0.1:1/0") as info:
        await RedisRegistry.connect(dead)
    assert "secret" not in str(info.value)
    with pytest.raises(ConnectionError, match="127.0.0.1:1"):
        await connect_bus(dead)


# -- the bus ------------------------------------------------------------------------------------


BusFactory = Callable[[], Bus]


@pytest.fixture(params=["memory", "redis"])
async def new_bus(request: pytest.FixtureRequest) -> AsyncIterator[BusFactory]:
    """Makes buses that reach each other, as replicas do; closes them after the test."""
    made: list[Bus] = []
    hub = MemoryHub()
    prefix = fresh_prefix()

    def make() -> Bus:
        if request.param == "memory":
            bus: Bus = MemoryBus(hub)
        else:
            bus = RedisBus(request.getfixturevalue("redis_url"), prefix)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        await bus.close()


@pytest.fixture
def buses(new_bus: BusFactory) -> tuple[Bus, Bus]:
    return new_bus(), new_bus()


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


class Recorder:
    """A handler that records what it got and whether two calls ever overlapped."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.got: list[Message] = []
        self.active = 0
        self.overlapped = False
        self.fail_on = fail_on

    async def __call__(self, message: Message) -> None:
        self.active += 1
        self.overlapped |= self.active > 1
        try:
            await asyncio.sleep(0.001 if message.get("n", 0) % 7 == 0 else 0)
            self.got.append(message)
            if message.get("n") == self.fail_on:
                raise RuntimeError("handler broke")
        finally:
            self.active -= 1

    def numbers(self) -> list[int]:
        return [m["n"] for m in self.got]


async def test_bus_order_per_channel_one_at_a_time(buses: tuple[Bus, Bus]) -> None:
    sub, pub = buses
    first, second = Recorder(), Recorder()
    await sub.subscribe("first", first)
    await sub.subscribe("second", second)
    for n in range(200):
        await pub.publish("first" if n % 3 else "second", {"n": n})
    await until(lambda: len(first.got) + len(second.got) == 200)
    assert first.numbers() == [n for n in range(200) if n % 3]
    assert second.numbers() == [n for n in range(200) if not n % 3]
    assert not first.overlapped and not second.overlapped


async def test_bus_handler_failure_is_logged_and_delivery_goes_on(
    buses: tuple[Bus, Bus], caplog: pytest.LogCaptureFixture
) -> None:
    sub, pub = buses
    broken, other = Recorder(fail_on=1), Recorder()
    await sub.subscribe("broken", broken)
    await sub.subscribe("other", other)
    with caplog.at_level(logging.ERROR, logger="render_server.signaling.state.bus"):
        for n in range(5):
            await pub.publish("broken", {"n": n})
            await pub.publish("other", {"n": n})
        await until(lambda: len(broken.got) == 5 and len(other.got) == 5)
    assert broken.numbers() == other.numbers() == [0, 1, 2, 3, 4]
    [record] = [r for r in caplog.records if r.getMessage() == "bus.handler_failed"]
    assert record.__dict__["channel"] == "broken"


async def test_bus_unsubscribe_and_resubscribe(buses: tuple[Bus, Bus]) -> None:
    sub, pub = buses
    old, new, marker = Recorder(), Recorder(), Recorder()
    await sub.subscribe("c", old)
    await sub.subscribe("marker", marker)
    await pub.publish("c", {"n": 1})
    await until(lambda: len(old.got) == 1)
    await sub.subscribe("c", new)  # replaces the handler
    await pub.publish("c", {"n": 2})
    await until(lambda: len(new.got) == 1)
    await sub.unsubscribe("c")
    await pub.publish("c", {"n": 3})
    await pub.publish("marker", {"n": 0})  # after the marker, "c" would have arrived too
    await until(lambda: len(marker.got) == 1)
    await asyncio.sleep(0.02)
    assert old.numbers() == [1] and new.numbers() == [2]
    await sub.subscribe("c", new)
    await pub.publish("c", {"n": 4})
    await until(lambda: len(new.got) == 2)
    assert new.numbers() == [2, 4]


async def test_bus_refuses_what_is_not_json(buses: tuple[Bus, Bus]) -> None:
    with pytest.raises(TypeError):
        await buses[1].publish("c", {"when": object()})


async def test_bus_subscribe_then_peer_reply_is_never_lost(new_bus: BusFactory) -> None:
    """Subscribe, then have a peer publish at once: the message must arrive, every time."""
    peer = new_bus()
    await peer.publish("warm-up", {})  # its connection is open: a publish is one write

    async def answer(message: Message) -> None:
        await peer.publish(message["reply_to"], {"n": message["n"]})

    await peer.subscribe("ask", answer)
    first = Recorder()
    for n in range(20):  # a new replica: its first subscribe opens its connection
        await new_bus().subscribe(f"first-{n}", first)
        await peer.publish(f"first-{n}", {"n": n})
    await until(lambda: len(first.got) == 20)
    asker, asked = new_bus(), Recorder()
    for n in range(60):  # one replica, a new channel each time, a peer asked to reply
        await asker.subscribe(f"reply-{n}", asked)
        await asker.publish("ask", {"n": n, "reply_to": f"reply-{n}"})
    await until(lambda: len(asked.got) == 60)
    direct = Recorder()
    for n in range(60):  # and published straight after subscribe returns
        await asker.subscribe(f"direct-{n}", direct)
        await peer.publish(f"direct-{n}", {"n": n})
    await until(lambda: len(direct.got) == 60)
    assert sorted(direct.numbers()) == list(range(60))  # channels run side by side


async def publish_until_heard(pub: Bus, channel: str, heard: Recorder) -> int:
    """Publish 0, 1, 2... until one arrives (the subscriber reconnects meanwhile)."""
    n = 0
    deadline = asyncio.get_running_loop().time() + 15
    while not heard.got:
        assert asyncio.get_running_loop().time() < deadline, "no delivery after reconnecting"
        try:
            await pub.publish(channel, {"n": n})
        except (redis.ConnectionError, ConnectionError):
            pass
        n += 1
        await asyncio.sleep(0.02)
    return n


async def test_redis_bus_reconnects_after_client_kill(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = fresh_prefix()
    sub = RedisBus(redis_url, prefix, backoff_s=(0.01, 0.1))
    pub = RedisBus(redis_url, prefix)
    admin = aioredis.Redis.from_url(redis_url)
    heard = Recorder()
    try:
        await sub.subscribe("c", heard)
        with caplog.at_level(logging.INFO, logger="render_server.signaling.state.bus"):
            assert await admin.client_kill_filter(_type="pubsub") >= 1
            sent = await publish_until_heard(pub, "c", heard)
            for n in range(sent, sent + 20):
                await pub.publish("c", {"n": n})
            await until(lambda: heard.numbers()[-1:] == [sent + 19])
        numbers = heard.numbers()
        assert numbers == list(range(numbers[0], sent + 20))  # in order, none lost after
        assert "bus.connection_lost" in caplog.text and "bus.reconnected" in caplog.text
    finally:
        await admin.aclose()
        await sub.close()
        await pub.close()


async def test_redis_bus_survives_a_redis_restart() -> None:
    with running_redis() as server:
        sub = RedisBus(server.url, backoff_s=(0.01, 0.1))
        pub = RedisBus(server.url)
        heard = Recorder()
        try:
            await sub.subscribe("c", heard)
            await pub.publish("c", {"n": -1})
            await until(lambda: len(heard.got) == 1)
            heard.got.clear()
            server.restart()
            await publish_until_heard(pub, "c", heard)
            # and subscribing works on the new server
            later = Recorder()
            await sub.subscribe("later", later)
            await pub.publish("later", {"n": 1})
            await until(lambda: len(later.got) == 1)
        finally:
            await sub.close()
            await pub.close()


async def test_memory_buses_on_different_hubs_do_not_meet() -> None:
    a, b = MemoryBus(), MemoryBus()
    heard = Recorder()
    await a.subscribe("c", heard)
    await b.publish("c", {"n": 1})
    await a.publish("c", {"n": 2})
    await until(lambda: len(heard.got) == 1)
    await asyncio.sleep(0.01)
    assert heard.numbers() == [2]
    await a.close()
    await b.close()


async def test_redis_bus_close_ends_even_as_a_read_times_out(redis_url: str) -> None:
    """A cancellation that lands as the reader's read times out must still end the reader."""
    for _ in range(40):
        bus = RedisBus(redis_url, fresh_prefix(), ping_interval_s=0.001)
        await bus.subscribe("c", Recorder())
        await asyncio.sleep(random.uniform(0, 0.005))
        await asyncio.wait_for(bus.close(), 2)
