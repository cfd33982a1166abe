"""A Redis blip does not kill a replica: a real redis-server restarted, stopped for a while, or
paused (SIGSTOP: it accepts connections and answers nothing, as a stalled host does).

- After a restart every pooled connection is stale; the first registry call, bus publish and
  store call succeed all the same (the clients retry on a fresh connection).
- A paused Redis makes calls fail within seconds (socket timeouts) instead of hanging them, and
  they work again once it resumes.
- /healthz answers 200 at once whatever Redis does (liveness); /readyz answers 503 while Redis
  is away and 200 once it is back; /metrics still renders, with `render_state_store_up 0`.
- The bus subscribes again after an outage and delivers; the outage is logged once as a
  WARNING (no traceback) and its end once as INFO, with its length.
- Session records that the restart lost are stored again, and counted again, by the renewal.

Each test runs a redis-server of its own: the shared one (conftest's `redis_url`) must not go
away under the other tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from render_server.config import ServerConfig
from render_server.signaling.edge import CONTEXT_KEY
from render_server.signaling.state.bus import RedisBus
from render_server.signaling.state.outage import StateHealth
from render_server.signaling.state.redis import (
    BACKOFF_CAP_S,
    CONNECT_TIMEOUT_S,
    RETRIES,
    SOCKET_TIMEOUT_S,
    connect_redis,
)
from render_server.signaling.state.redis_registry import RedisRegistry
from render_server.signaling.state.session_store import (
    CapReached,
    RedisSessionStore,
    SessionCaps,
    SessionRecord,
)

from .conftest import SMALL_STREAM
from .redis_server import RedisServer, fresh_prefix, running_redis
from .support import eventually_async

T = TypeVar("T")

# how long a call to a Redis that does not answer may take: a connect timeout (a fresh
# connection's handshake) and a socket timeout at most, timeouts not being retried; and a margin
# for a loaded machine. Refused connections are retried, within RETRIES backoffs.
UNANSWERED_S = CONNECT_TIMEOUT_S + SOCKET_TIMEOUT_S + 1.0
REFUSED_S = RETRIES * BACKOFF_CAP_S + 1.0
LIVENESS_S = 0.5  # /healthz answers within this, whatever Redis does


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


async def timed(aw: Awaitable[T]) -> tuple[T, float]:
    start = time.monotonic()
    result = await aw
    return result, time.monotonic() - start


def record(owner: str = "alice") -> SessionRecord:
    return SessionRecord(uuid.uuid4().hex, owner, "controller", "hash", address="10.0.0.1")


# -- the clients: a restart, a pause ------------------------------------------------------------


async def test_the_first_calls_after_a_restart_succeed(redis: RedisServer) -> None:
    prefix = fresh_prefix()
    registry = await RedisRegistry.connect(redis.url, prefix)
    bus = await RedisBus.connect(redis.url, prefix)
    store = RedisSessionStore(await connect_redis(redis.url, "store"), prefix)
    try:
        # several connections in each pool, all of them stale after the restart
        await asyncio.gather(*(registry.workers() for _ in range(4)))
        await asyncio.gather(*(bus.publish("c", {"n": i}) for i in range(4)))
        await asyncio.gather(*(store.get("nobody") for _ in range(4)))
        redis.restart()
        assert await registry.workers() == []
        await bus.publish("c", {"after": "restart"})
        assert await store.get("nobody") is None
        # and every other stale connection of the pools too
        assert await asyncio.gather(*(registry.workers() for _ in range(4))) == [[]] * 4
        await asyncio.gather(*(bus.publish("c", {"n": i}) for i in range(4)))
        assert await asyncio.gather(*(store.get("nobody") for _ in range(4))) == [None] * 4
    finally:
        await registry.close()
        await bus.close()
        await store.close()


async def test_a_paused_redis_fails_calls_within_seconds_and_serves_again(
    redis: RedisServer,
) -> None:
    prefix = fresh_prefix()
    registry = await RedisRegistry.connect(redis.url, prefix)
    store = RedisSessionStore(await connect_redis(redis.url, "store"), prefix)
    try:
        assert await registry.workers() == []
        redis.pause()
        try:
            for call in (registry.workers(), store.get("nobody"), store.delete("nobody")):
                start = time.monotonic()
                with pytest.raises((RedisTimeoutError, RedisConnectionError)):
                    await call
                assert time.monotonic() - start < UNANSWERED_S
        finally:
            redis.resume()
        assert await registry.workers() == []
        assert await store.get("nobody") is None
        # a stopped one refuses connections: the calls fail sooner still
        redis.stop()
        for call in (registry.workers(), store.get("nobody"), store.delete("nobody")):
            start = time.monotonic()
            with pytest.raises(RedisConnectionError):
                await call
            assert time.monotonic() - start < REFUSED_S
        redis.start()
        assert await registry.queue() == []
    finally:
        await registry.close()
        await store.close()


# -- the probes of a real replica ----------------------------------------------------------------


@pytest.fixture
async def replica(
    redis: RedisServer, aiohttp_server: Any
) -> AsyncIterator[tuple[TestServer, aiohttp.ClientSession]]:
    from render_server.cli.process import build_app

    config = dataclasses.replace(
        ServerConfig(port=0, stream=SMALL_STREAM, auth="off"),
        registry_url=redis.url,
        embedded_worker=False,
    )
    app: web.Application = await build_app(config)
    server: TestServer = await aiohttp_server(app, host="127.0.0.1")
    async with aiohttp.ClientSession() as http:
        yield server, http


async def get(
    replica: tuple[TestServer, aiohttp.ClientSession], path: str
) -> tuple[int, str, float]:
    """Status, body and seconds taken of GET `path`."""
    server, http = replica
    start = time.monotonic()
    async with http.get(server.make_url(path)) as response:
        return response.status, await response.text(), time.monotonic() - start


async def live(replica: tuple[TestServer, aiohttp.ClientSession]) -> dict[str, Any]:
    server, http = replica
    start = time.monotonic()
    async with http.get(server.make_url("/healthz")) as response:
        assert response.status == 200
        doc: dict[str, Any] = await response.json()
    assert time.monotonic() - start < LIVENESS_S
    return doc


async def ready(replica: tuple[TestServer, aiohttp.ClientSession]) -> bool:
    return (await get(replica, "/readyz"))[0] == 200


async def test_liveness_stays_and_readiness_follows_redis(
    redis: RedisServer, replica: tuple[TestServer, aiohttp.ClientSession]
) -> None:
    assert await ready(replica)
    status, text, _ = await get(replica, "/metrics")
    assert status == 200 and "render_state_store_up 1.0" in text
    doc = await live(replica)
    assert (doc["status"], doc["state"], doc["downForS"], doc["workers"]) == ("ok", "up", 0, 0)
    assert doc["replica"] and doc["fleetAgeS"] is not None

    for outage in ("stopped", "paused"):
        redis.stop() if outage == "stopped" else redis.pause()
        try:
            await live(replica)
            status, text, took = await get(replica, "/readyz")
            assert status == 503, (outage, text)
            assert took < 2.0, outage  # within its 1 s timeout (and a margin)
            assert "does not answer" in text, text
            doc = await live(replica)
            assert doc["state"] == "down" and doc["downForS"] >= 0, (outage, doc)
            assert doc["workers"] == 0 and doc["fleetAgeS"] > 0  # the last figures known
            status, text, took = await get(replica, "/metrics")
            assert status == 200 and took < 2.0, outage
            assert "render_state_store_up 0.0" in text and "signaling_connections" in text
            # the API says the state is away (and when to retry), not an internal error
            server, http = replica
            async with http.get(server.make_url("/api/workers")) as response:
                assert response.status == 503, (outage, await response.text())
                assert (await response.json())["code"] == "unavailable"
                assert response.headers["Retry-After"] == "1"
        finally:
            redis.start() if outage == "stopped" else redis.resume()
        await eventually_async(lambda: ready(replica), 15, 0.1, what=f"ready after {outage}")
        assert (await live(replica))["state"] == "up"
        assert "render_state_store_up 1.0" in (await get(replica, "/metrics"))[1]


async def test_a_stopping_replica_is_not_ready_but_live(
    replica: tuple[TestServer, aiohttp.ClientSession],
) -> None:
    assert await ready(replica)
    replica[0].app[CONTEXT_KEY].stopping = True
    status, text, _ = await get(replica, "/readyz")
    assert status == 503 and "stopping" in text
    assert (await live(replica))["stopping"] is True


# -- the bus --------------------------------------------------------------------------------------


async def test_the_bus_subscribes_again_after_an_outage_and_logs_it_once(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="render_server.signaling.state.bus")
    got: list[dict[str, Any]] = []

    async def handler(message: dict[str, Any]) -> None:
        got.append(message)

    bus = await RedisBus.connect(redis.url, fresh_prefix())
    try:
        await bus.subscribe("c", handler)

        async def delivered(n: int) -> bool:
            await bus.publish("c", {"n": n})
            await asyncio.sleep(0.05)
            return {"n": n} in got

        await eventually_async(lambda: delivered(0), 5, 0)
        redis.restart()  # the loop waits meanwhile: the reader finds Redis back at once
        await eventually_async(lambda: delivered(1), 10, 0)
        redis.stop()
        await asyncio.sleep(1.0)  # the reader tries again and again meanwhile
        redis.start()
        await eventually_async(lambda: delivered(2), 15, 0)
    finally:
        await bus.close()

    records = [r for r in caplog.records if r.name == "render_server.signaling.state.bus"]
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert warnings == ["bus.connection_lost"] * 2, warnings  # one per outage
    assert [r for r in records if r.levelno > logging.WARNING] == []
    assert not any(r.exc_info for r in records)
    assert "Traceback" not in caplog.text
    assert any(r.getMessage() == "bus.reconnect_failed" for r in records)  # DEBUG
    outages = [vars(r)["outage_s"] for r in records if r.getMessage() == "bus.reconnected"]
    assert len(outages) == 2 and outages[1] >= 0.9, outages


# -- the session store ----------------------------------------------------------------------------


async def test_renewing_stores_again_the_records_a_restart_lost(redis: RedisServer) -> None:
    store = RedisSessionStore(await connect_redis(redis.url, "store"), fresh_prefix())
    try:
        caps = SessionCaps(per_subject=2, per_address=0)
        held = [record(), record()]
        for r in held:
            assert await store.admit(r, caps) is None
        redis.restart()
        assert await store.get(held[0].session_id) is None  # the records are gone
        assert await store.held("subject", "alice") == 0
        assert await store.renew(held) == 2  # the holder still has them
        assert [await store.get(r.session_id) for r in held] == held
        assert await store.held("subject", "alice") == 2  # counted again
        assert await store.admit(record(), caps) == CapReached("subject", 2, 2)
        assert await store.renew(held) == 0
    finally:
        await store.close()


# -- the replica's view of its state --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_state_health_notes_outages_and_how_long_the_state_has_been_stable() -> None:
    clock = Clock()
    health = StateHealth(clock)
    clock.now += 5
    assert health.up and health.down_since is None and health.stable_for() == 5
    health.failed(RedisConnectionError("gone"))
    clock.now += 3
    health.failed(RedisConnectionError("still gone"))
    assert not health.up and health.down_since == 105 and health.down_for() == 3
    assert health.stable_for() == 0
    clock.now += 2
    health.ok()
    assert health.up and health.down_for() == 0 and health.stable_for() == 2

    async def answers() -> int:
        return 7

    async def hangs() -> None:
        await asyncio.sleep(10)

    assert await health.call(answers(), 1.0) == 7
    assert not await health.check(hangs(), 0.01)
    assert not health.up and "TimeoutError" in health.last_error
    assert await health.check(answers(), 1.0) and health.up


async def test_a_cancellation_as_the_state_answers_is_not_swallowed() -> None:
    """3.11's `wait_for` returned the answer when a cancellation landed as the call completed:
    the sweep went on, and the replica's shutdown waited on it for ever (a test's teardown
    hung 180 s in CI, the stuck task named by hang_watch)."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    call = loop.create_task(StateHealth().call(answer, 10.0))
    await asyncio.sleep(0)  # the call waits on the answer
    answer.set_result(1)
    call.cancel()  # in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await call
