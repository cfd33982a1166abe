"""Races between replicas over one session, reproduced with two replicas in one process (their
contexts share a registry, a session store and a bus hub, as replicas share a Redis) and a
scripted worker on the bus: each test failed before its fix.

- A session resumed on another replica while it was still opening: the old replica's open
  timer closed, later, the session the new replica served.
- A queued session whose browser went away kept the next in line waiting for its whole grace
  period: it is parked now (keeps its place, skipped), and comes back to it on a resume.
- A close whose answer is lost (the bus delivers at most once) kept the session for good: it is
  sent again, then the slot is freed without it.
- A queued session resumed on another replica did not know its queue score: when Redis lost
  its data, it was not queued again, and the session behind it was served first.
- An open lost on the bus (published while the worker's replica was resubscribing after a Redis
  outage) failed the session at its open timeout: it is sent again while unanswered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import pytest

from render_server.config import ServerConfig
from render_server.metrics import Metrics
from render_server.protocol.bus import Resumed
from render_server.protocol.requirements import Requirements
from render_server.protocol.signaling import ServerMessage
from render_server.protocol.worker import (
    CloseSession,
    OpenSession,
    SessionOpened,
    WorkerRequest,
    WorkerSessionEnded,
)
from render_server.signaling import session as session_module
from render_server.signaling.auth import Identity
from render_server.signaling.channels import Channels
from render_server.signaling.context import SignalingContext, connect_context
from render_server.signaling.relay import WorkerRelay
from render_server.signaling.session import SessionHandle
from render_server.signaling.session_table import SessionTable
from render_server.signaling.state.bus import MemoryBus, MemoryHub
from render_server.signaling.state.registry import MemoryRegistry, WorkerInfo
from render_server.signaling.state.session_store import MemorySessionStore

from .support import eventually_async

pytestmark = pytest.mark.asyncio

OPEN_TIMEOUT_S = 0.5
ALICE = Identity("alice", "controller", False)


@dataclass
class Browser:
    """What a replica sent one browser's socket."""

    seen: list[ServerMessage] = field(default_factory=list)

    async def send(self, message: ServerMessage) -> None:
        self.seen.append(message)

    def types(self) -> list[str]:
        return [m.type for m in self.seen]


@dataclass
class Worker:
    """A worker on the bus that opens only when told to, and records what it was asked."""

    worker_id: str
    asked: list[WorkerRequest] = field(default_factory=list)

    async def receive(self, request: WorkerRequest) -> None:
        self.asked.append(request)

    def closes(self) -> list[CloseSession]:
        return [r for r in self.asked if isinstance(r, CloseSession)]


@dataclass
class Replicas:
    a: SignalingContext
    b: SignalingContext
    table_a: SessionTable
    table_b: SessionTable


@pytest.fixture
async def replicas() -> AsyncIterator[Replicas]:
    config = ServerConfig(auth="off", embedded_worker=False, open_timeout_s=OPEN_TIMEOUT_S,
                          resume_grace_s=30.0)  # fmt: skip
    registry, store, hub = MemoryRegistry(), MemorySessionStore(), MemoryHub()
    made = []
    for name in ("replica-a", "replica-b"):
        ctx = await connect_context(config, Metrics())
        await ctx.close()  # its own memory state: replaced by the shared one
        made.append(replace(ctx, registry=registry, store=store,
                            channels=Channels(MemoryBus(hub)), replica_id=name))  # fmt: skip
    a, b = made
    yield Replicas(a, b, SessionTable(a), SessionTable(b))
    for ctx in made:
        await ctx.channels.close()


async def worker_on(ctx: SignalingContext, name: str, slots: int = 1) -> Worker:
    worker = Worker(name)
    await ctx.channels.on_worker(name, worker.receive)
    await WorkerRelay(ctx, name).register(WorkerInfo(name, slots, replica=ctx.replica_id))
    return worker


async def started(table: SessionTable, browser: Browser) -> SessionHandle:
    handle, _ = await table.create(ALICE, "10.0.0.1", Requirements())
    handle.attach(browser.send)
    await handle.start()
    return handle


async def test_a_resume_while_opening_is_not_closed_by_the_old_replicas_timer(
    replicas: Replicas,
) -> None:
    worker = await worker_on(replicas.a, "w")
    old_browser, new_browser = Browser(), Browser()
    handle = await started(replicas.table_a, old_browser)
    sid = handle.session_id
    await eventually_async(lambda: worker.asked, timeout=2)
    assert isinstance(worker.asked[0], OpenSession)  # opening: the worker has not answered

    # the page reloads onto replica B while the session is still opening
    bumped = await replicas.b.store.bump(sid, "controller")
    assert bumped is not None
    resumed = replicas.table_b.adopt(bumped)
    await replicas.b.channels.to_session(sid, Resumed(bumped.generation))
    resumed.attach(new_browser.send)
    await resumed.take_over()
    await WorkerRelay(replicas.b, "w").from_worker(SessionOpened(sid, 64, 64, 5.0))
    await eventually_async(lambda: "session.started" in new_browser.types(), timeout=2)

    await asyncio.sleep(OPEN_TIMEOUT_S * 3)  # past the old replica's open deadline
    assert worker.closes() == []  # nobody closed the session B serves
    assert await replicas.a.registry.holds("w", sid)
    assert "error" not in new_browser.types(), new_browser.seen


async def test_a_queued_browser_that_leaves_does_not_hold_up_the_next(replicas: Replicas) -> None:
    worker = await worker_on(replicas.a, "w")
    holder_browser, gone, waiting = Browser(), Browser(), Browser()
    holder = await started(replicas.table_a, holder_browser)
    first = await started(replicas.table_a, gone)
    second = await started(replicas.table_b, waiting)
    registry = replicas.a.registry
    assert await registry.queue() == [first.session_id, second.session_id]

    first.detach(gone.send)  # its page closed: it may come back within the grace (30 s)

    async def only_second_waits() -> bool:
        return await registry.queue() == [second.session_id]

    await eventually_async(only_second_waits, timeout=2)
    await holder.end()  # the slot frees: the next in line is the second session, not the gone
    ended = WorkerSessionEnded(holder.session_id, "client_ended")
    await WorkerRelay(replicas.a, "w").from_worker(ended)

    async def second_placed() -> bool:
        return await registry.worker_of(second.session_id) == "w"

    await eventually_async(second_placed, timeout=2)
    await eventually_async(
        lambda: any(isinstance(r, OpenSession) and r.session_id == second.session_id
                    for r in worker.asked), timeout=2,
    )  # fmt: skip

    # the first comes back: at the head of the queue again, not at its end
    back = Browser()
    bumped = await replicas.a.store.bump(first.session_id, "controller")
    assert bumped is not None
    again = replicas.table_a.adopt(bumped)
    again.attach(back.send)
    await again.take_over()
    assert await registry.position(first.session_id) == 1
    assert back.seen[-1].type == "queue"


async def test_a_close_whose_answer_is_lost_frees_the_slot(
    replicas: Replicas, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_module, "CLOSE_ACK_S", 0.2)
    worker = await worker_on(replicas.a, "w")
    browser = Browser()
    handle = await started(replicas.table_a, browser)
    sid = handle.session_id
    await WorkerRelay(replicas.a, "w").from_worker(SessionOpened(sid, 64, 64, 5.0))
    await eventually_async(lambda: handle.state == "open", timeout=2)

    await handle.end()  # the worker never answers (its `session.ended` was lost)
    await eventually_async(lambda: len(worker.closes()) == 2, timeout=2)

    async def freed() -> bool:
        return not await replicas.a.registry.holds("w", sid)

    await eventually_async(freed, timeout=2)
    await eventually_async(lambda: browser.types()[-1] == "session.ended", timeout=2)


async def test_queued_sessions_keep_their_order_when_the_registry_loses_its_data(
    replicas: Replicas,
) -> None:
    """Redis restarted empty: the replicas queue their waiting sessions again at their old
    places, a session resumed on another replica while it waited included."""
    await worker_on(replicas.a, "w")
    holder = await started(replicas.table_a, Browser())
    first = await started(replicas.table_a, (gone := Browser()))
    second = await started(replicas.table_b, Browser())
    registry = replicas.a.registry
    assert isinstance(registry, MemoryRegistry)
    assert await registry.queue() == [first.session_id, second.session_id]

    first.detach(gone.send)  # its page reloads onto replica B and takes its place back
    bumped = await replicas.b.store.bump(first.session_id, "controller")
    assert bumped is not None
    resumed = replicas.table_b.adopt(bumped)
    await replicas.b.channels.to_session(first.session_id, Resumed(bumped.generation))
    resumed.attach(Browser().send)
    await resumed.take_over()
    assert await registry.queue() == [first.session_id, second.session_id]

    registry.__init__()  # type: ignore[misc]  # Redis restarted with nothing
    for ctx in (replicas.a, replicas.b):
        ctx.state_health.failed(ConnectionError("redis restarted"))
        ctx.state_health.ok()
    relay = WorkerRelay(replicas.a, "w")
    await relay.register(WorkerInfo("w", 1, replica="replica-a"), (holder.session_id,))
    await replicas.table_a.renew()
    await replicas.table_b.renew()
    assert await registry.queue() == [first.session_id, second.session_id]


async def test_an_open_lost_on_the_bus_is_sent_again_and_the_session_opens(
    replicas: Replicas,
) -> None:
    worker = await worker_on(replicas.a, "w")
    browser = Browser()
    handle = await started(replicas.table_b, browser)  # placed from B on A's worker
    sid = handle.session_id
    await eventually_async(lambda: worker.asked, timeout=2)
    # the first open never reached the worker (it is in `asked` only as the test's record);
    # the worker answers the next one, as a worker answers any open
    opens = lambda: [r for r in worker.asked if isinstance(r, OpenSession)]  # noqa: E731
    await eventually_async(lambda: len(opens()) >= 2, timeout=OPEN_TIMEOUT_S * 0.9)
    assert worker.closes() == [] and all(r.session_id == sid for r in opens())
    await WorkerRelay(replicas.a, "w").from_worker(SessionOpened(sid, 64, 64, 5.0))
    await eventually_async(lambda: "session.started" in browser.types(), timeout=2)
    asked = len(worker.asked)
    await asyncio.sleep(OPEN_TIMEOUT_S * 2)  # past the deadline: answered, nothing more is sent
    assert len(worker.asked) == asked and worker.closes() == []
    assert "error" not in browser.types() and handle.state == "open"
