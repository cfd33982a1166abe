"""The session store's counts behind the caps, in memory and on a real Redis: admitted under the
caps, refused at them, freed when a session ends or its lease lapses (a replica renews what it
holds); and the registry's refusal of requirements that no registered worker can ever meet."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from render_server.config import ServerConfig
from render_server.metrics import Metrics
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import Requirements, parse_requirements
from render_server.signaling.auth import Identity
from render_server.signaling.context import connect_context
from render_server.signaling.session_table import SessionTable
from render_server.signaling.state.redis import connect_redis
from render_server.signaling.state.redis_registry import RedisRegistry
from render_server.signaling.state.registry import MemoryRegistry, Registry, WorkerInfo
from render_server.signaling.state.session_store import (
    CapReached,
    MemorySessionStore,
    RedisSessionStore,
    SessionCaps,
    SessionRecord,
    SessionStore,
)

from .redis_server import fresh_prefix
from .support import eventually_async

LEASE_S = 1.0  # the memory store's, on its own clock
REDIS_LEASE_S = 3.0  # real seconds: no test here takes that long, even on a loaded machine


class Clock:
    """The memory store's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[SessionStore]:
    made: SessionStore
    if request.param == "memory":
        made = MemorySessionStore(LEASE_S, Clock())
    else:
        client = await connect_redis(request.getfixturevalue("redis_url"), "test store")
        made = RedisSessionStore(client, fresh_prefix(), lease_s=REDIS_LEASE_S)
    yield made
    await made.close()


async def lapse(store: SessionStore, seconds: float) -> None:
    """Let `seconds` pass for the store: the memory store's clock, or real time for Redis."""
    if isinstance(store, MemorySessionStore):
        assert isinstance(store._clock, Clock)
        store._clock.now += seconds
    else:
        await asyncio.sleep(seconds)


def now(store: SessionStore) -> float:
    """The store's time: the memory store's clock, or real time for Redis."""
    if isinstance(store, MemorySessionStore):
        return store._clock()
    return time.monotonic()


def record(owner: str = "alice", address: str = "10.0.0.1") -> SessionRecord:
    return SessionRecord(uuid.uuid4().hex, owner, "controller", "hash", address=address)


async def test_admit_counts_each_subject_and_address_up_to_its_cap(store: SessionStore) -> None:
    caps = SessionCaps(per_subject=2, per_address=3)
    a1, a2 = record("alice"), record("alice")
    assert await store.admit(a1, caps) is None
    assert await store.admit(a2, caps) is None
    assert await store.admit(record("alice"), caps) == CapReached("subject", 2, 2)
    assert await store.admit(record("bob"), caps) is None
    # the address holds three now, whoever asks
    assert await store.admit(record("carol"), caps) == CapReached("address", 3, 3)
    assert await store.admit(record("carol", "10.0.0.2"), caps) is None
    assert await store.held("subject", "alice") == 2
    assert await store.held("address", "10.0.0.1") == 3
    # a refused record was not stored, and 0 means no cap
    assert await store.admit(record("alice", "10.0.0.9"), SessionCaps(0, 0)) is None
    assert await store.held("subject", "alice") == 3
    got = await store.get(a1.session_id)
    assert got is not None and got.address == "10.0.0.1"


async def test_an_ended_session_frees_its_places(store: SessionStore) -> None:
    caps = SessionCaps(per_subject=1, per_address=1)
    first = record()
    assert await store.admit(first, caps) is None
    assert await store.admit(record(), caps) is not None
    await store.delete(first.session_id)
    await store.delete(first.session_id)  # twice: nothing more
    assert await store.held("subject", "alice") == 0
    assert await store.held("address", "10.0.0.1") == 0
    assert await store.admit(record(), caps) is None


async def test_a_record_nobody_renews_stops_counting_when_its_lease_ends(
    store: SessionStore,
) -> None:
    caps = SessionCaps(per_subject=2, per_address=0)
    kept, orphan = record(), record()
    admitted = now(store)
    assert await store.admit(kept, caps) is None
    assert await store.admit(orphan, caps) is None

    async def renew_until_the_orphan_lapses() -> bool:
        await store.renew([kept])  # the holding replica renews; the orphan's died
        await lapse(store, store.lease_s * 0.2)
        return await store.get(orphan.session_id) is None

    await eventually_async(renew_until_the_orphan_lapses, store.lease_s + 30, every=0)
    assert now(store) - admitted >= store.lease_s * 0.99  # not before its lease ended
    assert await store.get(kept.session_id) is not None  # admitted first, but renewed
    assert await store.held("subject", "alice") == 1
    assert await store.admit(record(), caps) is None  # the orphan's place is free again
    assert await store.held("subject", "alice") == 2


async def test_renewing_stores_again_what_the_store_lost(store: SessionStore) -> None:
    """A holder renews with its own copies: a record gone (Redis restarted, or its lease lapsed
    while Redis was away) is stored again and counts again, past the caps (it runs already);
    one still stored keeps its value (a resume elsewhere bumped it)."""
    caps = SessionCaps(per_subject=2, per_address=0)
    lost, bumped = record(), record()
    assert await store.admit(lost, caps) is None
    assert await store.admit(bumped, caps) is None
    assert await store.bump(bumped.session_id, "viewer") is not None
    await store.delete(lost.session_id)  # as a restart loses it
    assert await store.admit(third := record(), caps) is None  # its place was free
    assert await store.renew([lost, bumped]) == 1
    assert await store.get(lost.session_id) == lost
    kept = await store.get(bumped.session_id)
    assert kept is not None and (kept.generation, kept.role) == (2, "viewer")
    assert await store.held("subject", "alice") == 3  # over the cap: admitted before
    assert await store.admit(record(), caps) == CapReached("subject", 3, 2)
    # renewing twice (a retried call) counts each session once
    assert await store.renew([lost, bumped, third]) == 0
    assert await store.held("subject", "alice") == 3
    assert await store.held("address", "10.0.0.1") == 3


async def test_a_resume_takes_the_tokens_role_and_keeps_the_count(store: SessionStore) -> None:
    first = record()
    assert await store.admit(first, SessionCaps(1, 1)) is None
    bumped = await store.bump(first.session_id, "viewer")
    assert bumped is not None and (bumped.generation, bumped.role) == (2, "viewer")
    again = await store.bump(first.session_id)  # no role given: the role stays
    assert again is not None and (again.generation, again.role) == (3, "viewer")
    stored = await store.get(first.session_id)
    assert stored == again
    assert await store.held("subject", "alice") == 1
    assert await store.bump(uuid.uuid4().hex, "viewer") is None


async def test_stopping_sharing_moves_the_share_epoch_on_and_a_resume_keeps_it(
    store: SessionStore,
) -> None:
    first = record()
    assert await store.admit(first, SessionCaps()) is None
    assert first.share_epoch == 0
    stopped = await store.stop_sharing(first.session_id)
    assert stopped is not None and stopped.share_epoch == 1
    resumed = await store.bump(first.session_id)
    assert resumed is not None and (resumed.share_epoch, resumed.generation) == (1, 2)
    again = await store.stop_sharing(first.session_id)
    assert again is not None and again.share_epoch == 2
    assert await store.get(first.session_id) == again
    await store.renew([first])  # the holder's older copy does not roll the epoch back
    assert (await store.get(first.session_id)) == again
    assert await store.stop_sharing(uuid.uuid4().hex) is None


async def test_two_replicas_admitting_at_once_never_pass_a_cap(redis_url: str) -> None:
    prefix = fresh_prefix()
    stores = [RedisSessionStore(await connect_redis(redis_url, "s"), prefix) for _ in range(2)]
    try:
        caps = SessionCaps(per_subject=5, per_address=0)
        records = [record("mallory", f"10.1.0.{i}") for i in range(40)]
        refusals = await asyncio.gather(
            *(stores[i % 2].admit(r, caps) for i, r in enumerate(records))
        )
        admitted = [r for r, refused in zip(records, refusals, strict=True) if refused is None]
        assert len(admitted) == 5
        assert await stores[0].held("subject", "mallory") == 5
        for r, refused in zip(records, refusals, strict=True):
            assert (await stores[1].get(r.session_id) is None) == (refused is not None)
    finally:
        for s in stores:
            await s.close()


async def test_records_of_an_older_replica_still_read() -> None:
    text = (
        '{"session_id": "s", "owner": "o", "role": "viewer", "token_hash": "h", '
        '"requirements": {}, "generation": 4, "created": 1.0, "from_the_future": 1}'
    )
    read = SessionRecord.from_json(text)
    assert (read.generation, read.address) == (4, "")


# -- the registry: requirements no worker can meet -----------------------------------------------


@pytest.fixture(params=["memory", "redis"])
async def registry(request: pytest.FixtureRequest) -> AsyncIterator[Registry]:
    reg: Registry
    if request.param == "memory":
        reg = MemoryRegistry()
    else:
        url = request.getfixturevalue("redis_url")
        reg = await RedisRegistry.connect(url, fresh_prefix())
    yield reg
    await reg.close()


GPU_EU = WorkerInfo(
    "w1", 1, {"codecs": ["H264"], "resolution": "1920x1080"}, labels=("gpu",), region="eu"
)


async def test_requirements_no_worker_meets_are_refused_when_asked(registry: Registry) -> None:
    gpu = Requirements(labels=frozenset({"gpu"}), resolution="1920x1080")
    # no worker at all: it waits for the fleet to come up, and the first fitting worker serves it
    assert (await registry.request("early", gpu, refuse_unservable=True)).position == 1
    assert [c.session_id for c in (await registry.register(GPU_EU)).served] == ["early"]
    # the worker is busy: a request it could serve waits
    assert (await registry.request("waits", gpu, refuse_unservable=True)).position == 1
    for name, unmet in [
        ("label", Requirements(labels=frozenset({"tpu"}))),
        ("region", Requirements(region="us")),
        ("codec", Requirements(codec="AV1")),
        ("size", Requirements(resolution="3840x2160")),
    ]:
        ticket = await registry.request(name, unmet, refuse_unservable=True)
        assert ticket.unservable and ticket.claim is None and ticket.position is None, name
        assert await registry.position(name) is None
        # asked without the refusal (a session placed again after its worker was lost): queued
        assert (await registry.request(name + "-again", unmet)).position is not None
    assert (await registry.queue())[0] == "waits"


def test_a_resolution_above_the_protocols_maximum_is_malformed() -> None:
    assert parse_requirements({"resolution": "7680x4320"}).resolution == "7680x4320"
    # digits of other scripts passed `\d` and then broke the registry (an `internal` answer)
    for text in ("99999x99999", "7682x4320", "7680x4322", "\u0661\u0662\u0663x\u0664\u0665\u0666"):
        with pytest.raises(ProtocolError) as info:
            parse_requirements({"resolution": text})
        assert info.value.code == ErrorCode.BAD_MESSAGE


# -- the replica renews what it holds --------------------------------------------------------------


async def test_a_replica_renews_its_sessions_and_a_dead_ones_lapse() -> None:
    ctx = await connect_context(ServerConfig(auth="off", embedded_worker=False), Metrics())
    lease_s = 1.0  # renewed every 0.25 s (a quarter): a stall of 0.75 s would still not lapse it
    ctx.store = store = MemorySessionStore(lease_s=lease_s)
    table = SessionTable(ctx)
    try:
        handle, _ = await table.create(Identity("anonymous", "controller", True), "10.0.0.1",
                                       Requirements())  # fmt: skip
        await handle.start()  # no worker registered: it waits in the queue
        renewing = asyncio.get_running_loop().create_task(table.keep_alive())
        await asyncio.sleep(2.5 * lease_s)  # over two leases: renewed all along
        assert await store.get(handle.session_id) is not None
        renewing.cancel()  # the replica dies

        async def lapsed() -> bool:
            return await store.get(handle.session_id) is None

        # within a lease of its last renewal; `eventually` looks once more after its deadline
        await eventually_async(lapsed, timeout=1.5 * lease_s, every=0.02)
        assert await store.held("address", "10.0.0.1") == 0
    finally:
        await ctx.close()
