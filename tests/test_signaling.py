"""The signaling socket against the real one-process server (aiohttp client, no browser)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import aiohttp
import pytest

from render_server.protocol.wire import MAX_MESSAGE_BYTES
from render_server.tools.viewer import Viewer

from .support import ServerFactory, fleet_figures, receive, ws_url

pytestmark = pytest.mark.asyncio


class _AnySessionId(str):
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and len(other) == 32

    __hash__ = str.__hash__


ANY_ID = _AnySessionId()


def frame(**fields: Any) -> str:
    return json.dumps({"v": 1, **fields})


async def expect_error(ws: aiohttp.ClientWebSocketResponse, payload: str, code: str) -> None:
    await ws.send_str(payload)
    reply = await receive(ws)
    assert reply["type"] == "error", reply
    assert reply["code"] == code, reply
    assert reply["message"]


async def test_health_and_metrics(start_server: ServerFactory) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http:
        async with http.get(server.make_url("/healthz")) as response:
            assert response.status == 200
            health = await response.json()
            assert (health["status"], health["state"]) == ("ok", "up")
        async with http.get(server.make_url("/metrics")) as response:
            text = await response.text()
            assert "worker_slots_free 2.0" in text
            assert fleet_figures(text) == {"workers": 1, "slots": 2, "free": 2}
        async with http.get(server.make_url("/api/workers")) as response:
            (worker,) = (await response.json())["workers"]
        assert (worker["slots"], worker["free"]) == (2, 2)
        capabilities = worker["capabilities"]
        assert capabilities["renderer"] in ("cpu", "cuda")
        assert "x264" in capabilities["encoders"] and capabilities["codecs"] == [
            "H264",
            "VP8",
            "AV1",
        ]
        assert "gpu" in capabilities and capabilities["slots"] == 2


async def test_malformed_messages_get_errors_and_the_socket_stays_usable(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await expect_error(ws, "{oops", "bad_json")
        await expect_error(ws, "[]", "bad_message")
        await expect_error(ws, json.dumps({"type": "session.start"}), "unsupported_version")
        await expect_error(ws, frame(type="format.disk"), "unknown_type")
        await expect_error(ws, frame(type="offer", sdp=17), "bad_message")
        await ws.send_bytes(b"\x00\x01")
        assert (await receive(ws))["code"] == "bad_message"
        # between the app limit and the transport limit: refused with an error, socket kept
        await expect_error(
            ws, frame(type="offer", sdp="v=0" + "x" * MAX_MESSAGE_BYTES), "too_large"
        )
        # after all that, the same socket still starts a session
        await ws.send_str(frame(type="session.start"))
        started = await receive(ws)
        assert started["type"] == "session.started"
        assert (started["width"], started["height"], started["codec"]) == (320, 240, "H264")
        await ws.send_str(frame(type="session.end"))
        assert (await receive(ws)) == {"v": 1, "type": "session.ended", "reason": "client_ended"}

        async with http.get(server.make_url("/metrics")) as response:
            text = await response.text()
        for code in ("bad_json", "bad_message", "unsupported_version", "unknown_type", "too_large"):
            assert f'signaling_rejected_total{{code="{code}"}}' in text, code


async def test_messages_over_the_transport_limit_close_the_socket(
    start_server: ServerFactory,
) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await ws.send_str(frame(type="offer", sdp="v=0" + "x" * (4 * MAX_MESSAGE_BYTES)))
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.CLOSE
        assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG


async def test_messages_in_the_wrong_order_are_refused(start_server: ServerFactory) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await expect_error(ws, frame(type="offer", sdp="v=0\r\n"), "bad_order")
        await expect_error(ws, frame(type="ice", candidate=""), "bad_order")
        await expect_error(ws, frame(type="session.end"), "bad_order")
        await ws.send_str(frame(type="session.start"))
        assert (await receive(ws))["type"] == "session.started"
        await expect_error(ws, frame(type="session.start"), "bad_order")
        await expect_error(ws, frame(type="ice", candidate=""), "bad_order")  # before the offer


async def test_an_offer_without_video_is_refused_and_frees_the_slot(
    start_server: ServerFactory,
) -> None:
    server = await start_server(slots=1)
    audio_only = (
        "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0\r\n"
        "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\na=recvonly\r\n"
        "a=rtcp-mux\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
        "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
    )
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await ws.send_str(frame(type="session.start"))
        assert (await receive(ws))["type"] == "session.started"
        await ws.send_str(frame(type="offer", sdp=audio_only))
        error = await receive(ws)
        assert error["code"] == "bad_offer" and "video" in error["message"], error
        assert (await receive(ws))["reason"] == "bad_offer"
        # the browser's candidates trickle in after the end: dropped quietly, no bad_order
        for port in range(15):
            candidate = f"candidate:1 1 udp 2122260223 127.0.0.1 {50000 + port} typ host"
            await ws.send_str(frame(type="ice", candidate=candidate, sdpMid="0"))
        # the only slot is free again: a new session starts on the same socket
        await ws.send_str(frame(type="session.start"))
        assert (await receive(ws))["type"] == "session.started"


async def test_a_full_server_queues_and_serves_in_turn(start_server: ServerFactory) -> None:
    server = await start_server(slots=1)
    async with aiohttp.ClientSession() as http:
        async with (
            http.ws_connect(ws_url(server)) as first,
            http.ws_connect(ws_url(server)) as second,
            http.ws_connect(ws_url(server)) as third,
        ):
            await first.send_str(frame(type="session.start"))
            assert (await receive(first))["type"] == "session.started"
            await second.send_str(frame(type="session.start"))
            queued = await receive(second)
            assert queued == {
                "v": 1, "type": "queue", "sessionId": ANY_ID, "position": 1,
                "resumeToken": queued["resumeToken"],  # the first time only: resume its place
            }  # fmt: skip
            assert len(queued["resumeToken"]) >= 16
            await third.send_str(frame(type="session.start"))
            assert (await receive(third))["position"] == 2
            await first.send_str(frame(type="session.end"))
            assert (await receive(first))["reason"] == "client_ended"
            # the slot goes to the first in line, and the line moves up
            served = await receive(second)
            assert served["type"] == "session.started" and "resumeToken" not in served
            assert (await receive(third)) == {
                "v": 1, "type": "queue", "sessionId": ANY_ID, "position": 1
            }  # fmt: skip
            await third.send_str(frame(type="session.end"))  # leaves the queue
            assert (await receive(third)) == {
                "v": 1,
                "type": "session.ended",
                "reason": "cancelled",
            }


async def test_a_browser_that_leaves_frees_its_slot_after_the_grace(
    start_server: ServerFactory,
) -> None:
    server = await start_server(slots=1, resume_grace_s=0.5)
    async with aiohttp.ClientSession() as http:
        first = await http.ws_connect(ws_url(server))
        await first.send_str(frame(type="session.start"))
        assert (await receive(first))["type"] == "session.started"
        async with http.ws_connect(ws_url(server)) as second:
            await second.send_str(frame(type="session.start"))
            assert (await receive(second))["type"] == "queue"
            await first.close()  # a closed tab: its slot is kept for the grace period, then freed
            assert (await receive(second, timeout=10))["type"] == "session.started"


async def test_floods_are_rate_limited(start_server: ServerFactory) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        for _ in range(150):
            await ws.send_str(frame(type="nonsense"))
        codes = []
        while (msg := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
            codes.append(json.loads(msg.data)["code"])
        assert "rate_limited" in codes and "unknown_type" in codes
        # a client that keeps misbehaving is cut off, with a reason
        assert len(codes) == 100
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION


async def test_origins(start_server: ServerFactory) -> None:
    server = await start_server(allowed_origins=("https://app.example",))
    url = ws_url(server)
    own = f"http://{server.host}:{server.port}"
    async with aiohttp.ClientSession() as http:
        for origin in (own, "https://app.example"):
            async with http.ws_connect(url, headers={"Origin": origin}) as ws:
                await ws.send_str(frame(type="session.start"))
                assert (await receive(ws))["type"] == "session.started"
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(url, headers={"Origin": "https://evil.example"})
        assert info.value.status == 403
        # DNS rebinding: a foreign name that resolves to this loopback server
        rebinding = {
            "Origin": f"http://evil.example:{server.port}",
            "Host": f"evil.example:{server.port}",
        }
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(url, headers=rebinding)
        assert info.value.status == 403


async def test_a_bad_client_does_not_disturb_another_session(start_server: ServerFactory) -> None:
    server = await start_server()
    async with Viewer(ws_url(server)) as good:
        await good.next_frame(timeout=20)
        async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as bad:
            for payload in ("{", "[]", frame(type="offer", sdp="v=0"), "x" * 70_000):
                await bad.send_str(payload)
            await bad.send_str(frame(type="offer", sdp="v=0" + "y" * (4 * MAX_MESSAGE_BYTES)))
            await bad.receive(timeout=10)
        received = 0
        for _ in range(20):
            frame_ = await good.next_frame(timeout=5)
            assert (frame_.width, frame_.height) == (320, 240)
            received += 1
        assert received == 20
        assert not good.ended.done()  # type: ignore[union-attr]


async def test_a_session_that_never_connects_frees_its_slot(start_server: ServerFactory) -> None:
    from .conftest import SMALL_STREAM

    stream = dataclasses.replace(SMALL_STREAM, connect_timeout_s=0.5)
    server = await start_server(slots=1, stream=stream)
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url(server)) as ws:
        await ws.send_str(frame(type="session.start"))
        assert (await receive(ws))["type"] == "session.started"
        # no offer: the worker gives the slot back after the timeout, and says why
        assert (await receive(ws)) == {"v": 1, "type": "session.ended", "reason": "connect_timeout"}
        await ws.send_str(frame(type="session.start"))
        assert (await receive(ws))["type"] == "session.started"


async def test_a_session_whose_worker_is_lost_while_closing_it_ends_there(
    start_server: ServerFactory,
) -> None:
    """The browser ended its session; the worker never answered the close and then went away.
    The session ends as asked: it is not placed again, where it would hold a slot (or a queue
    place) until the next worker's connect timeout."""
    server = await start_server()
    worker_url = str(server.make_url("/worker")).replace("http://", "ws://")
    async with aiohttp.ClientSession() as http:
        mute = await http.ws_connect(worker_url)
        await mute.send_str(frame(type="worker.register", workerId="mute", slots=1,
                                  labels=["mute"]))  # fmt: skip
        assert (await receive(mute))["type"] == "worker.registered"
        async with http.ws_connect(ws_url(server)) as browser:
            await browser.send_str(frame(type="session.start", requirements={"labels": ["mute"]}))
            opened = await receive(mute)
            assert opened["type"] == "session.open"
            await mute.send_str(
                frame(type="session.opened", sessionId=opened["sessionId"], width=64, height=64,
                      fps=5, codec="H264")
            )  # fmt: skip
            assert (await receive(browser))["type"] == "session.started"
            await browser.send_str(frame(type="session.end"))
            closing = await receive(mute)
            assert closing["type"] == "session.close"
            await mute.close()  # gone without an answer
            ended = await receive(browser)
            assert ended == {"v": 1, "type": "session.ended", "reason": "client_ended"}, ended
