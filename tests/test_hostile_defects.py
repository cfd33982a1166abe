"""What an attacker found, each against a real `render-server serve`: deep nesting ended the
browser socket (an uncaught RecursionError, close 1006) and the worker socket; on the data
channel a 2 KiB nested message, or a text message that is not UTF-8, raised into aiortc and
ended the peer's DTLS transport (the stream stopped: `session.peer_lost`); the worker socket
left binary frames unanswered. Every one must now be answered with an `error`, and the socket
or the stream goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from .hostile_clients import BackgroundLoop, CountingViewer, Served, send_text_bytes, serve
from .support import receive

pytestmark = pytest.mark.timeout(180)

DEEP = "[" * 5000 + "]" * 5000  # 10 KB: well within the 64 KiB of a socket message
DEEP_INPUT = "[" * 1024 + "]" * 1024  # 2048 bytes: the most a data-channel message may be


@pytest.fixture(scope="module")
def loop() -> Iterator[BackgroundLoop]:
    background = BackgroundLoop()
    yield background
    background.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The server all the tests here attack; once they have all run, whatever order they ran
    in, its log must hold no traceback (checked as the fixture ends: an error of the last test
    that used it, when there is one)."""
    with serve(tmp_path_factory.mktemp("defects") / "serve.log", fps=15, slots=4) as served:
        yield served
        log = served.log_text()
    assert "Traceback" not in log, log[max(0, log.index("Traceback") - 1000) :][:5000]


def test_deep_nesting_on_the_browser_socket_is_answered_and_the_socket_stays_open(
    loop: BackgroundLoop, server: Served
) -> None:
    async def run() -> None:
        async with aiohttp.ClientSession() as http, http.ws_connect(server.ws()) as ws:
            for text in (DEEP, '{"v": 1, "type": "session.end", "x": ' + DEEP + "}"):
                await ws.send_str(text)
                assert (await receive(ws))["code"] == "bad_json"
            await ws.send_str(json.dumps({"v": 1, "type": "session.end"}))
            assert (await receive(ws))["code"] == "bad_order"  # still read: no session yet

    loop.run(run())


def test_deep_nesting_on_the_worker_socket_is_answered_and_the_worker_stays(
    loop: BackgroundLoop, server: Served
) -> None:
    async def run() -> None:
        async with aiohttp.ClientSession() as http, http.ws_connect(server.ws("/worker")) as ws:
            register = {"v": 1, "type": "worker.register", "workerId": "deep", "slots": 1}
            await ws.send_str(json.dumps(register))
            assert (await receive(ws))["type"] == "worker.registered"
            await ws.send_str('{"v": 1, "type": "worker.heartbeat", "load": ' + DEEP + "}")
            assert (await receive(ws))["code"] == "bad_json"
            await ws.send_bytes(b'{"v": 1, "type": "worker.heartbeat"}')
            assert (await receive(ws))["code"] == "bad_message"  # was left unanswered
            await ws.send_str(json.dumps(register))
            assert (await receive(ws))["code"] == "bad_order"  # registered all along

    loop.run(run())


@pytest.mark.parametrize(
    "send",
    [
        pytest.param(lambda viewer: viewer.input.send(DEEP_INPUT), id="2048-bytes-nested"),
        pytest.param(
            lambda viewer: send_text_bytes(viewer, b'{"type": "\xff\xfe"}'), id="text-not-utf8"
        ),
    ],
)
def test_a_hostile_data_channel_message_is_answered_and_the_stream_goes_on(
    loop: BackgroundLoop, server: Served, send: Any
) -> None:
    async def run() -> str:
        viewer = CountingViewer(server.ws())
        await viewer.start()
        try:
            await viewer.more_frames()
            await viewer.ping()  # the channel is open
            start = len(viewer.messages)
            send(viewer)
            try:
                error = await viewer.wait_message("error", start=start, timeout=10)
            except TimeoutError:
                raise AssertionError("no answer on the data channel in 10 s") from None
            assert error["code"] == "bad_json", error
            await viewer.ping()
            await viewer.more_frames(10, timeout=10)  # the stream goes on
            return viewer.session_id
        finally:
            await viewer.close()

    session_id = loop.run(run())
    lost = [line for line in server.log_text().splitlines() if "session.peer_lost" in line]
    assert not [line for line in lost if session_id in line], lost


def test_a_worker_socket_that_keeps_sending_garbage_is_closed_with_1008(
    loop: BackgroundLoop, server: Served
) -> None:
    """A worker token is no licence to flood a replica: 100 refused messages close the socket,
    as on the browser socket (the worker can register again on a new one)."""

    async def run() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.ws_connect(server.ws("/worker")) as ws:
                register = {"v": 1, "type": "worker.register", "workerId": "noisy", "slots": 1}
                await ws.send_str(json.dumps(register))
                assert (await receive(ws))["type"] == "worker.registered"
                for _ in range(100):
                    await ws.send_bytes(b"{}")
                    assert (await receive(ws))["code"] == "bad_message"
                await ws.send_bytes(b"{}")
                closed = await ws.receive(timeout=10)
                assert closed.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1008, closed
            async with http.ws_connect(server.ws("/worker")) as ws:
                register = {"v": 1, "type": "worker.register", "workerId": "noisy", "slots": 1}
                await ws.send_str(json.dumps(register))
                assert (await receive(ws))["type"] == "worker.registered"

    loop.run(run())
