"""A worker's graceful drain (worker.drain, SIGTERM) and the state a session takes with it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from render_server.protocol.data_channel import QualityRequest, SceneCommand
from render_server.render.scene import Scene
from render_server.stream.session import StreamSession
from render_server.worker.agent import WorkerAgent
from render_server.worker.drain import Drain

from .fake_signaling import FakeSignaling, sid, until
from .test_worker_failover import running, tiny_worker

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def fake() -> AsyncIterator[FakeSignaling]:
    server = await FakeSignaling().start()
    yield server
    await server.stop()


async def open_sessions(fake: FakeSignaling, *numbers: int) -> None:
    for n in numbers:
        await fake.send({"type": "session.open", "sessionId": sid(n)})
    for n in numbers:
        await fake.wait_for("session.opened", sessionId=sid(n))


async def test_a_drain_hands_every_session_over_and_leaves_when_none_is_left(
    scene: Scene, fake: FakeSignaling
) -> None:
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, heartbeat_s=0.2)
    async with running(agent) as run:
        await until(agent.registered.is_set)
        await open_sessions(fake, 1, 2)
        await fake.send({"type": "worker.drain", "reason": "maintenance", "deadlineS": 30})
        draining = (await fake.wait_for("worker.draining"))[0]
        assert draining["reason"] == "maintenance" and 25 < draining["deadlineS"] <= 30
        handoffs = await fake.wait_for("session.handoff", count=2)
        assert {h["sessionId"] for h in handoffs} == {sid(1), sid(2)}
        assert all({"camera", "quality", "edits"} <= set(h["state"]) for h in handoffs)
        assert (await fake.wait_for("worker.heartbeat", draining=True))[0]["sessionIds"]
        # no new session while draining
        await fake.send({"type": "session.open", "sessionId": sid(3)})
        error = (await fake.wait_for("error", sessionId=sid(3)))[0]
        assert error["code"] == "no_capacity"
        await fake.wait_for("session.ended", sessionId=sid(3), reason="no_capacity")
        # a second drain changes nothing
        await fake.send({"type": "worker.drain", "reason": "again"})
        # signaling moved them: it closes them here
        for n in (1, 2):
            await fake.send({"type": "session.close", "sessionId": sid(n), "reason": "moved"})
        await fake.wait_for("worker.leaving", reason="drained")
        await asyncio.wait_for(run, 10)
    assert len(fake.of_type("worker.draining")) == 1
    assert fake.types()[-1] == "worker.leaving"  # the sessions had ended before it left


async def test_at_the_deadline_the_worker_says_it_leaves_then_closes_what_is_left(
    scene: Scene, fake: FakeSignaling
) -> None:
    agent = WorkerAgent(tiny_worker(scene), fake.url, None)
    async with running(agent) as run:
        await until(agent.registered.is_set)
        await open_sessions(fake, 4)
        await fake.send({"type": "worker.drain", "reason": "maintenance", "deadlineS": 0.5})
        await fake.wait_for("worker.leaving", reason="drain_timeout")
        await fake.wait_for("session.ended", sessionId=sid(4))
        await asyncio.wait_for(run, 10)
    types = fake.types()
    assert types.index("worker.leaving") < types.index("session.ended")


async def test_a_drain_goes_on_across_a_reconnection(scene: Scene, fake: FakeSignaling) -> None:
    agent = WorkerAgent(
        tiny_worker(scene), fake.url, None, jitter=lambda c: 0.1, drain_timeout_s=30
    )
    async with running(agent):
        await until(agent.registered.is_set)
        await open_sessions(fake, 5)
        assert agent.start_drain("sigterm")
        await fake.wait_for("session.handoff", sessionId=sid(5))
        await fake.drop()
        await fake.wait_for("worker.register", count=2)
        again = fake.registers[1]
        assert again["draining"] is True and again["sessionIds"] == [sid(5)]
        # the bus may have lost them: said again after the registration
        await fake.wait_for("worker.draining", count=2)
        await fake.wait_for("session.handoff", count=2, sessionId=sid(5))
        assert not agent.start_drain("sigint")  # one drain


async def test_handoffs_are_sent_again_while_sessions_stay(
    scene: Scene, fake: FakeSignaling
) -> None:
    agent = WorkerAgent(tiny_worker(scene), fake.url, None)
    agent.drain.resend_s = 0.3
    async with running(agent):
        await until(agent.registered.is_set)
        await open_sessions(fake, 6)
        agent.start_drain("maintenance")
        await fake.wait_for("session.handoff", count=3, sessionId=sid(6), timeout=10)


# -- the state that travels ---------------------------------------------------------------------


async def test_a_session_opened_from_another_ones_state_goes_on_where_it_was(
    scene: Scene,
) -> None:
    worker = tiny_worker(scene)
    ended: list[str] = []

    async def on_end(reason: str) -> None:
        ended.append(reason)

    first = await worker.open_session(sid(7), on_end)
    try:
        commands = first.input.commands
        material = scene.materials[0].name
        visible_object = scene.objects[-1]
        for name, args in [
            ("setCamera", {"yaw": 1.0, "pitch": 0.3, "distance": 4.0, "target": [0.5, 0, -1]}),
            ("setMaterial", {"material": material, "color": "#336699", "roughness": 0.2}),
            ("setVisible", {"object": visible_object, "visible": False}),
            ("setTimeOfDay", {"hours": 17.5}),
        ]:
            reply = commands.execute(SceneCommand(name, args, 1))
            assert reply["type"] == "result", reply
        first.input._set_quality(QualityRequest(width=320, height=180, fps=4, max_kbps=800))
        state = first.export_state()
    finally:
        await first.close("moved")
    second = await worker.open_session(sid(8), on_end, state=state)
    try:
        assert_same(first, second)
        assert second.pipeline.encoder.width == 320 and second.pipeline.fps == 4
    finally:
        await second.close("done")


def assert_same(a: StreamSession, b: StreamSession) -> None:
    ca, cb = a.input.controller.camera, b.input.controller.camera
    assert (ca.yaw, ca.pitch, ca.distance, ca.target) == (cb.yaw, cb.pitch, cb.distance, cb.target)
    assert a.quality == b.quality
    assert a.input.commands.edits == b.input.commands.edits


async def test_a_malformed_state_is_ignored_part_by_part(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    worker = tiny_worker(scene)

    async def on_end(reason: str) -> None:
        pass

    state: dict[str, Any] = {
        "camera": {"yaw": "left", "pitch": 0, "distance": 1, "target": [0, 0, 0]},
        "quality": [1, 2],
        "edits": {
            "materials": [{"name": "no such material", "baseColor": [0, 0, 0]}, 7],
            "hidden": ["no such object", None],
            "timeOfDay": 99,
        },
    }
    with caplog.at_level(logging.WARNING):
        session = await worker.open_session(sid(9), on_end, state=state)
    try:
        warned = [r for r in caplog.records if r.getMessage() == "session.state_ignored"]
        parts = {getattr(r, "part", None) for r in warned}
        assert {"camera", "quality", "edits.materials", "edits.hidden"} <= parts
        assert "edits.timeOfDay" in parts
        assert session.input.commands.edits.materials == {}
        assert session.quality.resolution == worker.stream.resolution
    finally:
        await session.close("done")


# -- a real worker process -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_process(
    fake: FakeSignaling, tmp_path: Path, *extra: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, Path]]:
    """`render-server worker` against `fake`: a 64x64 CPU stream; killed if still running."""
    args = [
        sys.executable, "-m", "render_server", "worker", "--signaling", fake.url,
        "--renderer", "cpu", "--encoder", "x264", "--resolution", "64x64", "--fps", "5",
        "--worker-id", "w-process", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RENDER_SERVER_SIGNALING", None)
    stderr = tmp_path / "stderr.txt"
    with stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=err
        )
        try:
            yield proc, stderr
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
                print(stderr.read_text()[-5000:], fake.types())


def assert_clean_exit(code: int, stderr: Path) -> None:
    text = stderr.read_text()
    assert code == 0, text[-3000:]
    assert "Task was destroyed" not in text and "Traceback" not in text, text[-3000:]


async def test_sigterm_drains_the_worker_process_and_it_exits_cleanly(
    fake: FakeSignaling, tmp_path: Path
) -> None:
    async with worker_process(fake, tmp_path, "--drain-timeout", "3") as (proc, stderr):
        await fake.wait_for("worker.register", timeout=120)
        await open_sessions(fake, 10, 11)
        proc.send_signal(signal.SIGTERM)
        await fake.wait_for("worker.draining")
        await fake.wait_for("session.handoff", count=2)
        await fake.send({"type": "session.close", "sessionId": sid(10), "reason": "moved"})
        await fake.wait_for("session.ended", sessionId=sid(10), reason="moved")
        # the other is never moved: the deadline
        await fake.wait_for("worker.leaving", reason="drain_timeout", timeout=15)
        code = await asyncio.wait_for(proc.wait(), 20)
    assert_clean_exit(code, stderr)
    said = [(m["type"], m.get("sessionId")) for m in fake.messages]
    leaving = said.index(("worker.leaving", None))
    # what was left is closed after `worker.leaving`
    assert ("session.ended", sid(11)) in said[leaving:], said
    assert len(fake.registers) == 1


async def test_a_second_signal_leaves_at_once(fake: FakeSignaling, tmp_path: Path) -> None:
    async with worker_process(fake, tmp_path, "--drain-timeout", "300") as (proc, stderr):
        await fake.wait_for("worker.register", timeout=120)
        await open_sessions(fake, 12)
        proc.send_signal(signal.SIGTERM)
        await fake.wait_for("session.handoff", sessionId=sid(12))
        proc.send_signal(signal.SIGINT)
        await fake.wait_for("worker.leaving", reason="interrupted", timeout=10)
        code = await asyncio.wait_for(proc.wait(), 20)
    assert_clean_exit(code, stderr)


class _SessionThatStays:
    """What a drain reads of the worker's sessions: one that is never handed over."""

    def __init__(self) -> None:
        self.draining = False
        self.sessions = {sid(1): None}
        self.idle = False
        self.changed = asyncio.Event()

    async def send(self, message: object) -> None:
        pass

    async def handoffs(self) -> None:
        pass


async def test_a_drain_cancelled_as_a_change_arrives_ends() -> None:
    """3.11's `wait_for` returned when a cancellation landed as the awaited change came: the
    drain's loop went on waiting, and the worker's shutdown with it."""
    service = _SessionThatStays()
    drain = Drain(cast(Any, service), timeout_s=60.0)
    assert drain.start("maintenance")
    await asyncio.sleep(0.05)  # announced; the loop waits for a change
    task = drain._task
    assert task is not None and not task.done()
    service.changed.set()
    task.cancel()  # in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(2.0):
            await task
    assert drain.finished.is_set()
