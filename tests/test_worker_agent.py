"""The worker's connection to signaling: what it does with messages it cannot take; its
status port; serve's embedded worker; the worker's options."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from render_server.config import ConfigError, Resolution, StreamConfig, WorkerConfig
from render_server.metrics import Metrics
from render_server.protocol.worker import (
    Heartbeat,
    Register,
    SessionReply,
    WorkerNotice,
    WorkerRequest,
)
from render_server.render import Scene, default_scene
from render_server.worker.agent import WorkerAgent
from render_server.worker.embedded import EmbeddedWorker
from render_server.worker.local import LocalWorker
from render_server.worker.status_server import StatusServer

from .fake_signaling import FakeSignaling, sid, until
from .test_worker_failover import running, tiny_worker


@pytest.fixture
def agent() -> WorkerAgent:
    stream = StreamConfig(resolution=Resolution(320, 240))
    worker = LocalWorker("w", default_scene(), stream, 1, Metrics())
    return WorkerAgent(worker, "ws://127.0.0.1:9/worker", None)


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", "{}", '{"type": "nonsense"}', ""])
async def test_a_bad_message_is_logged_and_dropped(
    agent: WorkerAgent, data: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        agent._dispatch(data)  # raised ValueError for "{not json" before
    assert [r.getMessage() for r in caplog.records] == ["worker.bad_message"]


async def test_a_refusal_is_logged_with_its_reason(
    agent: WorkerAgent, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = '{"type": "error", "code": "unauthorized", "message": "bad token"}'
    with caplog.at_level(logging.WARNING):
        agent._dispatch(refusal)
    assert [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records] == [
        ("worker.refused", "bad token")
    ]


# -- the status port -----------------------------------------------------------------------------


async def test_the_status_port_says_whether_the_worker_is_live_ready_and_draining(
    scene: Scene,
) -> None:
    fake = await FakeSignaling().start()
    agent = WorkerAgent(tiny_worker(scene), fake.url, None, drain_timeout_s=30)
    status = StatusServer(agent.status, agent.worker.metrics, "127.0.0.1", 0)
    port = await status.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def get(path: str) -> tuple[int, str]:
                async with http.get(base + path) as response:
                    return response.status, await response.text()

            code, text = await get("/healthz")  # live before signaling is reached
            assert code == 200 and json.loads(text)["registered"] is False
            assert (await get("/readyz"))[0] == 503
            async with running(agent):
                await until(agent.registered.is_set)
                await fake.send({"type": "session.open", "sessionId": sid(1)})
                await fake.wait_for("session.opened")
                code, text = await get("/readyz")
                assert code == 200, text
                code, text = await get("/metrics")
                assert "render_worker_draining 0.0" in text
                assert "render_worker_sessions 1.0" in text
                assert "render_worker_signaling_connected 1.0" in text
                agent.start_drain("maintenance")
                code, text = await get("/readyz")
                assert code == 503 and json.loads(text)["reason"] == "draining"
                assert "render_worker_draining 1.0" in (await get("/metrics"))[1]
                # signaling away: still live
                fake.accept = False
                await fake.drop()
                await until(lambda: not agent.registered.is_set())
                code, text = await get("/healthz")
                assert code == 200
                assert json.loads(text) == {
                    "status": "ok", "draining": True, "registered": False, "sessions": 1,
                }  # fmt: skip
                assert "render_worker_signaling_connected 0.0" in (await get("/metrics"))[1]
    finally:
        await status.stop()
        await fake.stop()


# -- serve's embedded worker ---------------------------------------------------------------------


class FlakyLink:
    """A WorkerLink whose first heartbeats fail (the registry out of reach)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.beats: list[Heartbeat] = []
        self.sent: list[Any] = []

    async def open(self, registration: Register, deliver: Callable[[WorkerRequest], None]) -> None:
        self.registration = registration

    async def heartbeat(self, beat: Heartbeat) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")
        self.beats.append(beat)

    async def send(self, reply: SessionReply | WorkerNotice) -> None:
        self.sent.append(reply)

    async def close(self) -> None:
        pass


async def test_the_embedded_workers_heartbeats_outlive_a_failing_registry(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    link = FlakyLink(failures=2)
    embedded = EmbeddedWorker(link, tiny_worker(scene), heartbeat_s=0.05)
    with caplog.at_level(logging.WARNING):
        await embedded.start()
        try:
            await until(lambda: link.beats)
        finally:
            await embedded.stop()
    failed = [r for r in caplog.records if r.getMessage() == "worker.heartbeat_failed"]
    assert len(failed) == 2 and not any(r.exc_info for r in failed)
    assert link.beats[0].session_ids == () and link.registration.instance


# -- options --------------------------------------------------------------------------------------


def test_signaling_urls_are_repeatable_and_comma_separated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from render_server.cli.main import build_parser
    from render_server.cli.options import worker_config

    monkeypatch.setenv("RENDER_SERVER_SIGNALING", "ws://a:1/worker, ws://b:2/worker")
    args = build_parser().parse_args(["worker"])
    config = worker_config(args)
    assert config.signaling_urls == ("ws://a:1/worker", "ws://b:2/worker")
    assert config.signaling_url == "ws://a:1/worker"
    args = build_parser().parse_args(
        ["worker", "--signaling", "ws://c:3/worker,ws://d:4/worker", "--signaling",
         "wss://e/worker", "--drain-timeout", "7", "--metrics-port", "9100",
         "--preemption-url", "http://169.254.169.254/latest/meta-data/spot/instance-action"]
    )  # fmt: skip
    config = worker_config(args)
    assert config.signaling_urls == ("ws://c:3/worker", "ws://d:4/worker", "wss://e/worker")
    assert (config.drain_timeout_s, config.metrics_port, config.metrics_host) == (
        7.0, 9100, "127.0.0.1",
    )  # fmt: skip
    assert config.preemption_url is not None and config.preemption_poll_s == 5.0
    monkeypatch.delenv("RENDER_SERVER_SIGNALING")
    assert worker_config(build_parser().parse_args(["worker"])).signaling_urls == (
        WorkerConfig().signaling_url,
    )
    with pytest.raises(ConfigError):
        WorkerConfig(signaling_urls=("ws://ok/worker", "http://not-a-socket"))
