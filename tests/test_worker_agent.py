"""The worker's connection to signaling: what it does with messages it cannot take."""

from __future__ import annotations

import logging

import pytest

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render import default_scene
from render_server.worker.agent import WorkerAgent
from render_server.worker.local import LocalWorker


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
