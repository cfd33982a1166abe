"""A worker's stop closes every session at once, and one session stuck in its teardown holds
the stop up no longer than `SESSION_CLOSE_S` (a server's shutdown must end)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import pytest

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render import Scene
from render_server.stream.session import StreamSession
from render_server.worker import service as service_module
from render_server.worker.local import LocalWorker
from render_server.worker.service import WorkerService

STREAM = StreamConfig(resolution=Resolution(160, 120), fps=30.0)


class Session:
    """A session's close as the service sees it: it takes `close_s`, or never ends."""

    def __init__(self, session_id: str, close_s: float | None) -> None:
        self.session_id = session_id
        self.close_s = close_s
        self.closed: str | None = None

    async def close(self, reason: str) -> None:
        if self.close_s is None:
            await asyncio.Event().wait()
        await asyncio.sleep(self.close_s)
        self.closed = reason


async def test_a_session_stuck_in_its_teardown_does_not_hold_up_the_stop(
    scene: Scene, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service_module, "SESSION_CLOSE_S", 0.5)

    async def send(message: Any) -> None:
        pass

    service = WorkerService(LocalWorker("w", scene, STREAM, 4, Metrics()), send)
    stuck, slow, quick = Session("a" * 32, None), Session("b" * 32, 0.3), Session("c" * 32, 0)
    for session in (stuck, slow, quick):
        service.sessions[session.session_id] = cast(StreamSession, session)
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger=service_module.__name__):
        await asyncio.wait_for(service.close_all("server_stopping"), 5)
    took = time.monotonic() - started
    assert slow.closed == quick.closed == "server_stopping" and stuck.closed is None
    assert 0.5 <= took < 2.0, took  # the bound, once: the sessions close side by side
    stuck_logged = [r for r in caplog.records if r.msg == "worker.session_close_stuck"]
    assert [getattr(r, "session", None) for r in stuck_logged] == [stuck.session_id]
