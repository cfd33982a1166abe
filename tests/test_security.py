"""Secure by default: tokens at the upgrade, roles, sessions that only their owner reaches,
TURN credentials per session; every refusal clear, logged, and unnoticed by other sessions."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import time

import aiohttp
import jwt
import numpy as np
import pytest

from render_server.signaling.auth import AUDIENCE, Authenticator
from render_server.tools.viewer import Viewer
from tests.fake_worker import FakeWorker

from .processes import SECRET, token
from .support import ServerFactory, ws_url

pytestmark = pytest.mark.asyncio


def audit_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "render_server.audit" and r.msg == event]


async def secured(start_server: ServerFactory, **overrides: object):  # type: ignore[no-untyped-def]
    return await start_server(auth="on", secret=SECRET, **overrides)


async def refused(url: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await http.ws_connect(url, headers=headers)
        async with http.get(url.replace("ws://", "http://"), headers=headers) as response:
            body = await response.json() if response.status in (401, 403) else {}
    return info.value.status, body


async def test_tokens_are_checked_at_the_upgrade(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "render_server.audit")
    server = await secured(start_server)
    url = ws_url(server)
    worker_url = url.replace("/ws", "/worker")
    expired = Authenticator({"default": SECRET.encode()}).mint("controller", "old", ttl_s=-60)
    forged = jwt.encode(
        {"sub": "mallory", "role": "controller", "aud": AUDIENCE, "exp": time.time() + 60},
        "another-secret-that-is-also-long-enough", algorithm="HS256",
    )  # fmt: skip
    cases = [
        ({}, 401, "required"),
        ({"Authorization": f"Bearer {expired}"}, 401, "expired"),
        ({"Authorization": f"Bearer {forged}"}, 401, "not valid"),
        ({"Authorization": "Bearer not.a.jwt"}, 401, "not valid"),
        ({"Authorization": f"Bearer {token('worker')}"}, 403, "cannot open"),
    ]
    for headers, status, words in cases:
        got, body = await refused(url, headers)
        assert got == status, (headers, got)
        assert words in body["message"], body
    got, body = await refused(worker_url, {"Authorization": f"Bearer {token('controller')}"})
    assert got == 403
    assert len(audit_lines(caplog, "audit.auth.rejected")) >= len(cases) + 1
    # a browser's token may come as a subprotocol (browsers cannot set headers)
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(
            url, protocols=("render-server.v1", f"bearer.{token('controller')}")
        ) as ws:
            assert ws.protocol == "render-server.v1"
            await ws.send_str(json.dumps({"v": 1, "type": "session.start"}))
            assert json.loads((await ws.receive(timeout=10)).data)["type"] == "session.started"


async def test_a_viewer_watches_but_its_input_never_reaches_the_worker(
    start_server: ServerFactory,
) -> None:
    server = await secured(start_server)
    async with Viewer(ws_url(server), token=token("viewer", "vera")) as viewer:
        assert viewer.session_info["role"] == "viewer"
        await viewer.next_frame(timeout=20)
        before = (await viewer.latest_frame()).to_ndarray(format="rgb24").astype(np.int16)
        for _ in range(5):
            await viewer.send_input(
                {"type": "pointer", "action": "move", "dx": 0.05, "dy": 0.0, "buttons": 1}
            )
        for _ in range(50):
            if viewer.errors:
                break
            await asyncio.sleep(0.1)
        assert viewer.errors and viewer.errors[0]["code"] == "forbidden"
        after = (await viewer.latest_frame()).to_ndarray(format="rgb24").astype(np.int16)
        assert np.abs(before - after).mean() < 1.0  # the camera did not move


async def test_nobody_reaches_another_users_session(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "render_server.audit")
    server = await secured(start_server)
    async with Viewer(ws_url(server), token=token("controller", "alice")) as alice:
        await alice.next_frame(timeout=20)
        sid = alice.session_info["sessionId"]
        resume_token = alice.session_info["resumeToken"]
        async with aiohttp.ClientSession() as http:
            bob_headers = {"Authorization": f"Bearer {token('controller', 'bob')}"}
            async with http.ws_connect(ws_url(server), headers=bob_headers) as bob:
                for guess in ("x" * 32, resume_token):  # a guess, then alice's stolen token
                    await bob.send_str(json.dumps(
                        {"v": 1, "type": "session.resume", "sessionId": sid, "resumeToken": guess}
                    ))  # fmt: skip
                    reply = json.loads((await bob.receive(timeout=10)).data)
                    assert reply["code"] == "forbidden", reply
                # offers, candidates and ends go to bob's own session only: he has none
                await bob.send_str(
                    json.dumps({"v": 1, "type": "offer", "sdp": "v=0\r\n", "sessionId": sid})
                )
                assert json.loads((await bob.receive(timeout=10)).data)["code"] == "bad_order"
                await bob.send_str(json.dumps({"v": 1, "type": "session.end", "sessionId": sid}))
                assert json.loads((await bob.receive(timeout=10)).data)["code"] == "bad_order"
            # nor over REST
            async with http.get(server.make_url(f"/api/sessions/{sid}"), headers=bob_headers) as r:
                assert r.status == 403
            async with http.delete(
                server.make_url(f"/api/sessions/{sid}"), headers=bob_headers
            ) as r:
                assert r.status == 403
        assert len(audit_lines(caplog, "audit.resume.refused")) == 2
        assert len(audit_lines(caplog, "audit.api.refused")) == 2
        for _ in range(15):  # alice noticed nothing
            await alice.next_frame(timeout=5)
        assert not alice.ended.done()  # type: ignore[union-attr]


async def test_origins_outside_the_allow_list_are_refused(start_server: ServerFactory) -> None:
    server = await secured(start_server, allowed_origins=("https://app.example",))
    headers = {"Authorization": f"Bearer {token('controller')}"}
    status, _ = await refused(ws_url(server), {**headers, "Origin": "https://evil.example"})
    assert status == 403
    async with aiohttp.ClientSession() as http:
        ok = {**headers, "Origin": "https://app.example"}
        async with http.ws_connect(ws_url(server), headers=ok) as ws:
            assert not ws.closed


async def test_turn_credentials_are_minted_per_session_for_both_ends(
    start_server: ServerFactory,
) -> None:
    turn_secret = "coturn-static-auth-secret"
    server = await secured(
        start_server, embedded_worker=False, turn_urls=("turn:turn.example:3478",),
        turn_secret=turn_secret, turn_ttl_s=600,
    )  # fmt: skip
    worker = FakeWorker(
        str(server.make_url("/worker")).replace("http", "ws"), "fake-1", 2, token=token("worker")
    )
    await worker.start()
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(
                ws_url(server), headers={"Authorization": f"Bearer {token('controller', 'carol')}"}
            ) as ws,
        ):
            await ws.send_str(json.dumps({"v": 1, "type": "session.start"}))
            started = json.loads((await ws.receive(timeout=10)).data)
        (turn,) = started["iceServers"]
        expiry, name = turn["username"].split(":")
        assert name == started["sessionId"]
        assert 590 < int(expiry) - time.time() <= 600
        digest = hmac.new(turn_secret.encode(), turn["username"].encode(), hashlib.sha1).digest()
        assert turn["credential"] == base64.b64encode(digest).decode()  # what coturn computes
        assert turn_secret not in json.dumps(started)
        # the worker's end got the same credentials with the session.open
        assert worker.ice_servers[started["sessionId"]] == started["iceServers"]
    finally:
        await worker.stop()


async def test_a_worker_cannot_speak_for_another_workers_session(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "render_server.audit")
    server = await secured(start_server, embedded_worker=False)
    url = str(server.make_url("/worker")).replace("http", "ws")
    honest = FakeWorker(url, "honest", 1, token=token("worker", "honest"))
    rogue = FakeWorker(url, "rogue", 1, token=token("worker", "rogue"))
    await honest.start()
    await rogue.start()
    try:
        headers = {"Authorization": f"Bearer {token('controller', 'kim')}"}
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(ws_url(server), headers=headers) as ws,
        ):
            await ws.send_str(json.dumps({"v": 1, "type": "session.start"}))
            started = json.loads((await ws.receive(timeout=10)).data)
            sid = started["sessionId"]
            victim = honest if started["workerId"] == "honest" else rogue
            forger = rogue if victim is honest else honest
            # the other worker answers for, then ends, a session it does not hold
            await forger.send_raw({"type": "answer", "sessionId": sid, "sdp": "v=0\r\nforged"})
            await forger.send_raw({"type": "session.ended", "sessionId": sid, "reason": "forged"})
            reply = await forger.next_error()
            assert reply["code"] == "forbidden"
            await ws.send_str(json.dumps({"v": 1, "type": "offer", "sdp": "v=0\r\n"}))
            answer = json.loads((await ws.receive(timeout=10)).data)
            assert answer == {"v": 1, "type": "answer", "sdp": victim_sdp()}  # the real one
        assert audit_lines(caplog, "audit.worker.forged")
    finally:
        await honest.stop()
        await rogue.stop()


def victim_sdp() -> str:
    from tests.fake_worker import PLACEHOLDER_SDP

    return PLACEHOLDER_SDP


async def test_oversized_messages_and_floods_are_refused_logged_and_harmless(
    start_server: ServerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "render_server.audit")
    server = await secured(start_server)
    async with Viewer(ws_url(server), token=token("controller", "hana")) as hana:
        await hana.next_frame(timeout=20)
        headers = {"Authorization": f"Bearer {token('controller', 'ivan')}"}
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(ws_url(server), headers=headers) as ivan,
        ):
            await ivan.send_str(json.dumps({"v": 1, "type": "offer", "sdp": "v=0" + "x" * 70_000}))
            assert json.loads((await ivan.receive(timeout=10)).data)["code"] == "too_large"
            for _ in range(80):
                await ivan.send_str(json.dumps({"v": 1, "type": "session.end"}))
            codes = [json.loads((await ivan.receive(timeout=10)).data)["code"] for _ in range(80)]
            assert "rate_limited" in codes
        assert audit_lines(caplog, "audit.message.too_large")
        assert audit_lines(caplog, "audit.rate_limited")
        for _ in range(10):
            await hana.next_frame(timeout=5)


async def test_an_idle_controller_session_ends(start_server: ServerFactory) -> None:
    import dataclasses

    from .conftest import SMALL_STREAM

    server = await start_server(stream=dataclasses.replace(SMALL_STREAM, idle_timeout_s=1.0))
    async with Viewer(ws_url(server)) as idle:
        await idle.next_frame(timeout=20)
        assert await asyncio.wait_for(idle.ended, 10) == "idle"  # type: ignore[arg-type]
