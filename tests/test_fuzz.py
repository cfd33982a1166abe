"""Whatever a client sends, the parsers answer with a typed message or a coded error."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.protocol.data_channel import INPUT_TYPES, InputError, parse_input
from render_server.protocol.errors import ProtocolError
from render_server.protocol.signaling import parse_client_message


@pytest.fixture(scope="module")
def live_server() -> Iterator[str]:
    """The one-process server in a thread of its own (hypothesis drives it synchronously)."""
    from aiohttp import web

    from render_server.cli.process import build_app
    from render_server.config import Resolution, ServerConfig, StreamConfig

    from .browser import free_port

    port = free_port()
    ready = threading.Event()
    stop: asyncio.Event | None = None
    loop = asyncio.new_event_loop()

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        config = ServerConfig(
            port=port, stream=StreamConfig(resolution=Resolution(64, 64)), slots=2
        )
        runner = web.AppRunner(await build_app(config))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await stop.wait()
        await runner.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(60), "the server did not start"
    yield f"ws://127.0.0.1:{port}/ws"
    assert stop is not None
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
signaling_docs = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2, "1", None]),
     "type": st.sampled_from(["session.start", "offer", "ice", "session.end", "x"]) | scalars},
    optional={"sdp": values, "candidate": values, "sdpMid": values, "sdpMLineIndex": values},
)  # fmt: skip
input_docs = st.fixed_dictionaries(
    {"type": st.sampled_from(INPUT_TYPES) | scalars},
    optional={k: values for k in ("action", "x", "y", "dx", "dy", "buttons", "shift", "code",
                                  "touches")},
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.one_of(signaling_docs.map(json.dumps), st.text(max_size=200), st.binary(max_size=200)))
def test_signaling_parser_never_fails_otherwise(data: str | bytes) -> None:
    try:
        parse_client_message(data)
    except ProtocolError as exc:
        assert exc.code and exc.message


@settings(max_examples=400, deadline=None)
@given(st.one_of(input_docs.map(json.dumps), st.text(max_size=200), st.binary(max_size=200)))
def test_input_parser_never_fails_otherwise(data: str | bytes) -> None:
    try:
        parse_input(data)
    except InputError as exc:
        assert exc.code and exc.message


# -- against a live server -----------------------------------------------------------------------

KNOWN_REPLIES = {
    "error",
    "session.started",
    "queue",
    "session.ended",
    "answer",
    "session.interrupted",
}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(signaling_docs.map(json.dumps), st.text(max_size=300)), min_size=1,
                max_size=8))  # fmt: skip
def test_a_live_server_answers_anything_with_a_message_or_a_coded_error(
    live_server: str, messages: list[str]
) -> None:
    async def exchange() -> None:
        async with aiohttp.ClientSession() as http, http.ws_connect(live_server) as ws:
            for text in messages:
                await ws.send_str(text)
                try:
                    reply = await ws.receive(timeout=5)
                except TimeoutError:  # an accepted message needs no reply (a candidate)
                    assert not ws.closed
                    continue
                assert reply.type == aiohttp.WSMsgType.TEXT, reply  # never a dropped socket
                doc = json.loads(reply.data)
                assert doc["type"] in KNOWN_REPLIES, doc
                if doc["type"] == "error":
                    assert doc["code"] != "internal", doc  # no exception leaks out
                    assert doc["message"]

    asyncio.run(exchange())
