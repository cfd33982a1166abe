"""A worker and its signaling replicas: failover, backoff, sessions that outlive a lost
connection, and every close acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render.scene import Scene
from render_server.worker.agent import WorkerAgent
from render_server.worker.local import LocalWorker
from render_server.worker.signaling_links import Backoff

from .fake_signaling import FakeSignaling, sid, until

TINY = StreamConfig(resolution=Resolution(64, 64), fps=5.0, renderer="cpu", encoder="x264")
INSTANCE = re.compile(r"[0-9A-Za-z_-]{8,64}")


def tiny_worker(scene: Scene, slots: int = 2) -> LocalWorker:
    return LocalWorker("w1", scene, TINY, slots, Metrics())


@contextlib.asynccontextmanager
async def running(agent: WorkerAgent) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.get_running_loop().create_task(agent.run())
    try:
        yield task
    finally:
        if not task.done():
            await agent.stop("test_done")
        await asyncio.wait_for(task, 20)


@pytest.fixture
async def signaling() -> AsyncIterator[Callable[..., Any]]:
    started: list[FakeSignaling] = []

    async def start(**kwargs: Any) -> FakeSignaling:
        fake = await FakeSignaling(**kwargs).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        await fake.stop()


async def test_a_dropped_replica_fails_over_to_the_next_at_once(
    scene: Scene, signaling: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = await signaling(), await signaling()
    # any sleep between attempts would be 5 s
    agent = WorkerAgent(tiny_worker(scene), [a.url, b.url], None, jitter=lambda cap: 5.0)
    with caplog.at_level(logging.INFO, logger="render_server.worker"):
        async with running(agent):
            await a.wait_for("worker.register")
            await until(agent.registered.is_set)
            await asyncio.sleep(1.2)  # a connection that lasted (not a flapping replica)
            a.accept = False
            dropped = time.monotonic()
            await a.drop()
            await b.wait_for("worker.register", timeout=3)
            assert time.monotonic() - dropped < 3
            await until(agent.registered.is_set)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("worker.signaling_lost") == 1
    assert "worker.signaling_restored" in messages
    restored = next(r for r in caplog.records if r.getMessage() == "worker.signaling_restored")
    assert restored.seconds < 3  # type: ignore[attr-defined]
    assert not any(r.exc_info for r in caplog.records), "no tracebacks for network errors"


async def test_refusals_do_not_reset_the_backoff(
    scene: Scene, signaling: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    fake = await signaling(refuse="worker id 'w1' is already registered and alive")
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, jitter=lambda cap: cap)
    with caplog.at_level(logging.DEBUG, logger="render_server.worker"):
        async with running(agent):
            await until(lambda: len(fake.connects) >= 4, timeout=15)
    gaps = [b - a for a, b in zip(fake.connects, fake.connects[1:], strict=False)]
    # 0.5 s, 1 s, 2 s: the sleep doubles after each refusal instead of starting over
    assert gaps[0] >= 0.45 and gaps[1] >= 0.95 and gaps[2] >= 1.9, gaps
    refused = [r for r in caplog.records if r.getMessage() == "worker.refused"]
    assert len(refused) >= len(fake.connects) - 1  # once per connection
    assert all(r.levelno == logging.ERROR for r in refused)
    assert all(r.levelno < logging.ERROR for r in caplog.records if r not in refused)
    assert not any(r.exc_info for r in caplog.records)


def test_the_backoff_grows_to_its_cap_and_starts_over_after_a_registration() -> None:
    backoff = Backoff(jitter=lambda cap: cap)
    assert [backoff.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    backoff.reset()
    assert backoff.next() == 0.5
    jittered = Backoff()
    assert all(0 <= jittered.next() <= 10.0 for _ in range(50))


async def test_sessions_outlive_a_lost_connection_and_are_reported_again(
    scene: Scene, signaling: Callable[..., Any]
) -> None:
    fake = await signaling()
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, heartbeat_s=0.2, jitter=lambda c: 0.1)
    async with running(agent):
        await fake.wait_for("worker.register")
        first = fake.registers[0]
        assert INSTANCE.fullmatch(first["instance"]) and first.get("draining", False) is False
        await fake.send({"type": "session.open", "sessionId": sid(1)})
        await fake.wait_for("session.opened", sessionId=sid(1))
        beat = await fake.wait_for("worker.heartbeat", sessionIds=[sid(1)])
        assert beat[0].get("draining", False) is False

        fake.accept = False
        await fake.drop()
        await until(lambda: not agent.registered.is_set())
        # ended while signaling is away: kept, and sent after the next registration
        await fake_end(agent, sid(1), "idle")
        assert sid(1) not in agent.service.sessions
        fake.accept = True
        await fake.wait_for("worker.register", count=2)
        again = fake.registers[1]
        assert again["instance"] == first["instance"]
        assert again.get("sessionIds", []) == []  # it has ended meanwhile
        ended = await fake.wait_for("session.ended", sessionId=sid(1))
        assert ended[0]["reason"] == "idle"


async def fake_end(agent: WorkerAgent, session_id: str, reason: str) -> None:
    await agent.service.sessions[session_id].close(reason)


async def test_a_session_is_kept_across_a_reconnection(
    scene: Scene, signaling: Callable[..., Any]
) -> None:
    fake = await signaling()
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, jitter=lambda c: 0.1)
    async with running(agent):
        await fake.wait_for("worker.register")
        await fake.send({"type": "session.open", "sessionId": sid(2)})
        await fake.wait_for("session.opened", sessionId=sid(2))
        session = agent.service.sessions[sid(2)]
        await fake.drop()
        await fake.wait_for("worker.register", count=2)
        assert fake.registers[1]["sessionIds"] == [sid(2)]
        assert agent.service.sessions[sid(2)] is session, "the same session, not a new one"
        # signaling did not know it (a stray): it closes it, and the worker says it ended
        await fake.send({"type": "session.close", "sessionId": sid(2), "reason": "stray"})
        ended = await fake.wait_for("session.ended", sessionId=sid(2))
        assert ended[0]["reason"] == "stray"
        assert sid(2) not in agent.service.sessions


async def test_a_close_for_an_unknown_session_is_acknowledged(
    scene: Scene, signaling: Callable[..., Any]
) -> None:
    fake = await signaling()
    agent = WorkerAgent(tiny_worker(scene), fake.url, None)
    async with running(agent):
        await until(agent.registered.is_set)
        await fake.send({"type": "session.close", "sessionId": sid(9), "reason": "gone"})
        ended = await fake.wait_for("session.ended", sessionId=sid(9))
        assert ended[0]["reason"] == "gone"
        assert "error" not in fake.types()


async def test_strays_named_after_the_registration_are_closed(
    scene: Scene, signaling: Callable[..., Any]
) -> None:
    """Signaling answers a registration with `session.close` for sessions it does not know."""
    fake = await signaling()
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, jitter=lambda c: 0.1)
    async with running(agent):
        await until(agent.registered.is_set)
        await fake.send({"type": "session.open", "sessionId": sid(3)})
        await fake.wait_for("session.opened", sessionId=sid(3))
        fake.after_register = [{"type": "session.close", "sessionId": sid(3), "reason": "stray"}]
        await fake.drop()
        ended = await fake.wait_for("session.ended", sessionId=sid(3))
        assert ended[0]["reason"] == "stray"
        await until(lambda: not agent.service.sessions)
