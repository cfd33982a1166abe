"""A failure of ours in one message's handling is answered and logged, and whatever carries the
message goes on: the data channel (nothing raises into aiortc), the browser and worker sockets,
the bus between replicas, the worker's socket to signaling."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiortc import RTCPeerConnection, RTCSessionDescription

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render.scene import Scene
from render_server.signaling import browser_socket, worker_socket
from render_server.signaling.state.bus import Bus, MemoryBus, MemoryHub, Message, RedisBus
from render_server.stream.session import StreamSession
from render_server.transport.guard import HandlerGuard, guard_data_channels
from render_server.worker.agent import WorkerAgent
from render_server.worker.local import LocalWorker

from .redis_server import fresh_prefix
from .support import ServerFactory, eventually_async, receive, ws_url

pytestmark = pytest.mark.asyncio


def failures(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == event]


# -- the data channel and aiortc's handlers --------------------------------------------------------


class Browser:
    """A real peer connection offering what the page offers, with its `input` channel."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.pc.addTransceiver("video", direction="recvonly")
        self.channel = self.pc.createDataChannel("input")
        self.messages: list[dict[str, Any]] = []
        self.opened = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.channel.on("message", lambda data: self.messages.append(json.loads(data)))

    async def connect(self, session: StreamSession) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        answer = await session.accept_offer(self.pc.localDescription.sdp)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.wait_for(self.opened.wait(), 20)

    async def answer(self, message: dict[str, Any], kind: str) -> dict[str, Any]:
        start = len(self.messages)
        self.channel.send(json.dumps(message))

        def found() -> dict[str, Any] | None:
            return next((m for m in self.messages[start:] if m.get("type") == kind), None)

        def unanswered() -> str:
            return f"no {kind} answered {message}: {self.messages[start:]}"

        return await eventually_async(found, 10, what=unanswered)


async def test_a_failing_command_is_answered_internal_logged_once_and_the_stream_goes_on(
    worker_session: StreamSession, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("a bug in a command")

    worker_session.input.commands.execute = broken  # type: ignore[method-assign]
    browser = Browser()
    try:
        await browser.connect(worker_session)
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                error = await browser.answer({"type": "command", "name": "getCamera"}, "error")
                assert error["code"] == "internal"
        assert (await browser.answer({"type": "ping", "id": 1, "t": 0}, "pong"))["id"] == 1
        frames = worker_session.frames
        await eventually_async(
            lambda: worker_session.frames > frames, 10, what="the stream goes on"
        )
        assert worker_session.pc is not None and worker_session.pc.connectionState == "connected"
    finally:
        await browser.pc.close()
    [logged] = failures(caplog, "session.handler_failed")  # once, not once per message
    assert logged.__dict__["session"] == "b" * 32 and logged.exc_info is not None


async def test_handlers_on_aiortc_swallow_and_log_once(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.guard")
    guard = HandlerGuard(log)
    calls: list[str] = []

    def sync(x: str) -> None:
        calls.append(x)
        raise ValueError(x)

    async def coroutine(x: str) -> None:
        calls.append(x)
        raise ValueError(x)

    with caplog.at_level(logging.DEBUG, logger="test.guard"):
        for x in ("one", "two"):
            guard.sync("a", sync)(x)
        for x in ("three", "four"):
            await guard.coroutine("b", coroutine)(x)
    assert calls == ["one", "two", "three", "four"] and guard.failures == 4
    records = [r for r in caplog.records if r.name == "test.guard"]
    assert [r.getMessage() for r in records] == ["session.handler_failed"] * 4
    assert [r.__dict__["event"] for r in records] == ["a", "a", "b", "b"]
    # the first failure with its traceback, the later ones only at DEBUG, without one
    assert [(r.levelno, r.exc_info is not None) for r in records] == [
        (logging.ERROR, True), (logging.DEBUG, False), (logging.DEBUG, False),
        (logging.DEBUG, False),
    ]  # fmt: skip
    assert records[0].exc_info is not None and isinstance(records[0].exc_info[1], ValueError)
    assert [r.__dict__["n"] for r in records[1:]] == [2, 3, 4]


class FakeSctp:
    """What `guard_data_channels` wraps: aiortc's data-channel receive path."""

    def __init__(self) -> None:
        self.got: list[tuple[int, bytes]] = []

    async def _data_channel_receive(self, stream_id: int, pp_id: int, data: bytes) -> None:
        if data == b"boom":
            raise AssertionError("a malformed DCEP message")
        if pp_id == 51:
            data.decode("utf8")  # as aiortc decodes a text message: may raise
        self.got.append((pp_id, data))


async def test_data_channel_receive_takes_text_that_is_not_utf8_as_binary() -> None:
    sctp = FakeSctp()
    guard = HandlerGuard(logging.getLogger("test.guard"))
    guard_data_channels(sctp, guard)  # type: ignore[arg-type]
    guard_data_channels(sctp, guard)  # type: ignore[arg-type]  # once only
    await sctp._data_channel_receive(1, 51, b'{"type": "\xff"}')
    await sctp._data_channel_receive(1, 51, b'{"type": "blur"}')
    await sctp._data_channel_receive(1, 50, b"boom")
    assert sctp.got == [(53, b'{"type": "\xff"}'), (51, b'{"type": "blur"}')]
    assert guard.failures == 1


# -- the sockets -----------------------------------------------------------------------------------


def failing_on(marker: str, parse: Any) -> Any:
    def parse_or_fail(data: str | bytes) -> Any:
        if marker in str(data):
            raise RuntimeError("a bug in the parser")
        return parse(data)

    return parse_or_fail


async def test_the_browser_socket_answers_a_failure_internal_and_stays_open(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parse = failing_on("BUG", browser_socket.parse_client_message)
    monkeypatch.setattr(browser_socket, "parse_client_message", parse)
    server = await start_server()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await ws.send_str(json.dumps({"v": 1, "type": "session.end", "x": "BUG"}))
        assert (await receive(ws))["code"] == "internal"
        await ws.send_str(json.dumps({"v": 1, "type": "session.end"}))
        assert (await receive(ws))["code"] == "bad_order"  # still reading
    assert failures(caplog, "signaling.internal_error")


async def test_the_worker_socket_answers_a_failure_internal_and_stays_open(
    start_server: ServerFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parse = failing_on("BUG", worker_socket.parse_from_worker)
    monkeypatch.setattr(worker_socket, "parse_from_worker", parse)
    server = await start_server()
    url = ws_url(server).replace("/ws", "/worker")
    async with aiohttp.ClientSession() as http, http.ws_connect(url) as ws:
        register = {"v": 1, "type": "worker.register", "workerId": "w2", "slots": 1}
        await ws.send_str(json.dumps(register))
        assert (await receive(ws))["type"] == "worker.registered"
        await ws.send_str(json.dumps({"v": 1, "type": "worker.heartbeat", "x": "BUG"}))
        assert (await receive(ws))["code"] == "internal"
        await ws.send_bytes(b"{}")
        assert (await receive(ws))["code"] == "bad_message"
        await ws.send_str(json.dumps(register))
        assert (await receive(ws))["code"] == "bad_order"  # still registered
    assert failures(caplog, "worker_socket.internal_error")


# -- the worker's socket to signaling ------------------------------------------------------------


async def test_the_worker_drops_deep_or_malformed_messages_from_signaling(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    stream = StreamConfig(resolution=Resolution(160, 90))
    agent = WorkerAgent(LocalWorker("w", scene, stream, 1, Metrics()), "ws://127.0.0.1:9/w", None)
    for data in ("[" * 5000 + "]" * 5000, '{"v": 1, "type": "offer", "sdp": NaN}', "\ud800"):
        with caplog.at_level(logging.WARNING):
            agent._dispatch(data)
    assert [r.getMessage() for r in caplog.records] == ["worker.bad_message"] * 3


# -- the bus ---------------------------------------------------------------------------------------


HOSTILE_PAYLOADS = [
    b"[" * 5000 + b"]" * 5000,
    b'{"n": "\xff"}',
    b"[1, 2]",
    b'{"n": NaN}',
    b'{"n": "' + b"x" * (300 * 1024) + b'"}',
    b"{not json",
]


async def until_heard(got: list[Message], count: int) -> None:
    def heard() -> str:
        return f"{len(got)} of {count} messages"

    await eventually_async(lambda: len(got) >= count, 10, 0.01, what=heard)


async def test_the_redis_bus_drops_hostile_payloads_and_keeps_its_connection(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = fresh_prefix()
    bus: Bus = RedisBus(redis_url, prefix)
    raw = aioredis.Redis.from_url(redis_url)
    got: list[Message] = []

    async def handler(message: Message) -> None:
        got.append(message)

    try:
        with caplog.at_level(logging.INFO, logger="render_server.signaling.state.bus"):
            await bus.subscribe("c", handler)
            for payload in HOSTILE_PAYLOADS:
                await raw.publish(f"{prefix}:c", payload)
            await raw.publish(f"{prefix}:c", b'{"n": 1}')
            await until_heard(got, 1)
        assert got == [{"n": 1}]
        assert len(failures(caplog, "bus.bad_message")) == len(HOSTILE_PAYLOADS)
        assert not failures(caplog, "bus.connection_lost")
    finally:
        await raw.aclose()
        await bus.close()


async def test_the_memory_bus_drops_what_a_redis_subscriber_would(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = MemoryHub()
    sub, pub = MemoryBus(hub), MemoryBus(hub)
    got: list[Message] = []

    async def handler(message: Message) -> None:
        got.append(message)

    await sub.subscribe("c", handler)
    with caplog.at_level(logging.WARNING, logger="render_server.signaling.state.bus"):
        await pub.publish("c", {"n": "x" * (300 * 1024)})
        await pub.publish("c", {"n": [[[[[[[[[[0]]]]]]]]]]})
        await pub.publish("c", {"n": 1})
        await until_heard(got, 1)
    assert got == [{"n": 1}]
    assert len(failures(caplog, "bus.bad_message")) == 2
    await sub.close()
    await pub.close()
