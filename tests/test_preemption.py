"""A spot VM's interruption notice, from a local endpoint in AWS's and GCP's shapes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from render_server.render.scene import Scene
from render_server.worker.agent import WorkerAgent
from render_server.worker.preemption import Notice, PreemptionWatcher

from .fake_signaling import FakeSignaling, sid, until
from .test_worker_failover import running, tiny_worker


class Metadata:
    """A metadata service: no notice until `notice` is set."""

    def __init__(self) -> None:
        self.notice: str | None = None
        self.down = False  # answer 500, as a metadata service having a bad moment
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.token: str | None = None  # IMDSv2: the token handed out, required after
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/spot/instance-action", self._aws)
        app.router.add_get("/computeMetadata/v1/instance/preempted", self._gcp)
        self.server = TestServer(app, host="127.0.0.1")

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))

    async def _token(self, request: web.Request) -> web.Response:
        self.requests.append(("PUT", request.path, dict(request.headers)))
        if request.headers.get("X-aws-ec2-metadata-token-ttl-seconds") != "21600":
            return web.Response(status=400)
        self.token = "t0ken-v2"
        return web.Response(text=self.token)

    async def _aws(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, dict(request.headers)))
        if self.token is not None and request.headers.get("X-aws-ec2-metadata-token") != self.token:
            return web.Response(status=401)
        if self.down:
            return web.Response(status=500)
        if self.notice is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=self.notice, content_type="application/json")

    async def _gcp(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, dict(request.headers)))
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(status=403)
        return web.Response(text="TRUE" if self.notice else "FALSE")


@pytest.fixture
async def metadata() -> AsyncIterator[Metadata]:
    service = Metadata()
    await service.server.start_server()
    yield service
    await service.server.close()


@contextlib.asynccontextmanager
async def watch(watcher: PreemptionWatcher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.get_running_loop().create_task(watcher.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def aws_notice(seconds: float) -> str:
    at = datetime.now(UTC) + timedelta(seconds=seconds)
    return json.dumps({"action": "terminate", "time": at.strftime("%Y-%m-%dT%H:%M:%SZ")})


@pytest.mark.parametrize("imds_token", [True, False])
async def test_an_aws_spot_notice_starts_the_drain_with_the_time_left(
    metadata: Metadata, imds_token: bool
) -> None:
    notices: list[Notice] = []
    url = metadata.url("/latest/meta-data/spot/instance-action")
    watcher = PreemptionWatcher(url, 0.05, notices.append, 100.0, imds_token=imds_token)
    task = asyncio.get_running_loop().create_task(watcher.run())
    try:
        await until(lambda: watcher.polls >= 3)
        assert not notices  # 404: no notice
        metadata.notice = aws_notice(60)
        await until(lambda: notices)
        await asyncio.wait_for(task, 5)  # one notice: the watcher is done
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert notices[0].action == "terminate"
    assert 45 <= notices[0].deadline_s <= 50.5  # 60 s left, less 10 s of safety
    puts = [r for r in metadata.requests if r[0] == "PUT"]
    gets = [r for r in metadata.requests if r[0] == "GET"]
    if imds_token:
        assert len(puts) == 1  # the token is kept
        assert all(h.get("X-aws-ec2-metadata-token") == "t0ken-v2" for _, _, h in gets)
    else:
        assert not puts


def test_the_deadline_is_the_drain_timeout_at_most_and_never_negative() -> None:
    watcher = PreemptionWatcher("http://x/spot/instance-action", 5, print, 100.0)
    now = time.time()
    assert watcher.parse(aws_notice(3600), now).deadline_s == 100.0  # type: ignore[union-attr]
    assert watcher.parse(aws_notice(5), now).deadline_s == 0.0  # type: ignore[union-attr]
    assert watcher.parse('{"action": "stop"}').deadline_s == 100.0  # type: ignore[union-attr]
    assert watcher.parse("FALSE") is None and watcher.parse("") is None
    assert watcher.parse('{"action": "none"}') is None and watcher.parse("<html>") is None
    assert watcher.parse("TRUE").deadline_s == 20.0  # type: ignore[union-attr]


async def test_a_gcp_preemption_notice_is_read_with_its_header(metadata: Metadata) -> None:
    notices: list[Notice] = []
    url = metadata.url("/computeMetadata/v1/instance/preempted")
    watcher = PreemptionWatcher(url, 0.05, notices.append, 100.0)
    async with watch(watcher):
        await until(lambda: watcher.polls >= 2)
        assert not notices  # FALSE
        metadata.notice = "TRUE"
        await until(lambda: notices)
    assert notices[0].action == "preempted"
    assert all(h.get("Metadata-Flavor") == "Google" for _, _, h in metadata.requests)


async def test_an_endpoint_that_fails_never_stops_the_watcher(
    metadata: Metadata, caplog: pytest.LogCaptureFixture
) -> None:
    notices: list[Notice] = []
    url = metadata.url("/latest/meta-data/spot/instance-action")
    metadata.down = True
    dead = PreemptionWatcher("http://127.0.0.1:9/nothing", 0.05, notices.append, 100.0)
    watcher = PreemptionWatcher(url, 0.05, notices.append, 100.0)
    with caplog.at_level(logging.DEBUG, logger="render_server.worker.preemption"):
        async with watch(dead):
            async with watch(watcher):
                await until(lambda: dead.polls >= 3 and watcher.polls >= 3)
                metadata.down = False
                metadata.notice = aws_notice(120)
                await until(lambda: notices)
    assert all(r.levelno <= logging.DEBUG for r in caplog.records if "poll" in r.getMessage())
    assert not any(r.exc_info for r in caplog.records)


async def test_a_notice_drains_the_worker(scene: Scene, metadata: Metadata) -> None:
    fake = await FakeSignaling().start()
    try:
        agent = WorkerAgent(tiny_worker(scene), fake.url, None)

        def drain(notice: Notice) -> Any:
            return agent.start_drain("preempted", notice.deadline_s)

        url = metadata.url("/latest/meta-data/spot/instance-action")
        watcher = PreemptionWatcher(url, 0.05, drain, 100.0)
        async with running(agent):
            await until(agent.registered.is_set)
            await fake.send({"type": "session.open", "sessionId": sid(1)})
            await fake.wait_for("session.opened")
            async with watch(watcher):
                metadata.notice = aws_notice(40)
                draining = (await fake.wait_for("worker.draining"))[0]
                assert draining["reason"] == "preempted" and 25 <= draining["deadlineS"] <= 30.5
                await fake.wait_for("session.handoff", sessionId=sid(1))
    finally:
        await fake.stop()
