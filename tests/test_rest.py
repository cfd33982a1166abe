"""The REST API: create a session, attach a browser to it, look at it, end it."""

from __future__ import annotations

import json

import aiohttp
import pytest

from render_server.tools.viewer import Viewer

from .processes import SECRET, token
from .support import ServerFactory, ws_url

pytestmark = pytest.mark.asyncio


def bearer(subject: str, role: str = "controller") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role, subject)}"}


async def test_create_attach_inspect_and_end_a_session(start_server: ServerFactory) -> None:
    server = await start_server(auth="on", secret=SECRET)
    dana = bearer("dana")
    async with aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/api/sessions"), headers=dana, json={}) as r:
            assert r.status == 201
            created = await r.json()
        sid = created["sessionId"]
        assert created["state"] == "assigned" and created["workerId"]
        assert created["attach"] == {
            "type": "session.resume", "sessionId": sid, "resumeToken": created["resumeToken"],
        }  # fmt: skip

        # the browser attaches with the message the API handed out, and streams
        async with http.ws_connect(ws_url(server), headers=dana) as ws:
            await ws.send_str(json.dumps({"v": 1, **created["attach"]}))
            started = json.loads((await ws.receive(timeout=15)).data)
            assert started["type"] == "session.started" and started["sessionId"] == sid

            async with http.get(server.make_url(f"/api/sessions/{sid}"), headers=dana) as r:
                assert r.status == 200
                described = await r.json()
            assert described["owner"] == "dana" and described["state"] == "assigned"

            async with http.delete(server.make_url(f"/api/sessions/{sid}"), headers=dana) as r:
                assert r.status == 202
            ended = json.loads((await ws.receive(timeout=15)).data)
            assert ended == {"v": 1, "type": "session.ended", "reason": "ended_by_api"}

        async with http.get(server.make_url(f"/api/sessions/{sid}"), headers=dana) as r:
            assert r.status == 404
            assert (await r.json())["code"] == "unknown_session"


async def test_an_unattached_session_is_released_after_the_grace(
    start_server: ServerFactory,
) -> None:
    server = await start_server(auth="on", secret=SECRET, slots=1, resume_grace_s=0.5)
    async with aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/api/sessions"), headers=bearer("eve")) as r:
            sid = (await r.json())["sessionId"]
    async with Viewer(ws_url(server), token=token("controller", "frank")) as frank:
        await frank.next_frame(timeout=20)  # the only slot came free for frank
    async with aiohttp.ClientSession() as http:
        async with http.get(server.make_url(f"/api/sessions/{sid}"), headers=bearer("eve")) as r:
            assert r.status == 404


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "bad_json"),
        (b"[1]", 400, "bad_message"),
        (b'{"requirements": {"labels": [1]}}', 400, "bad_message"),
        (b'{"requirements": {"resolution": "huge"}}', 400, "bad_message"),
        (b"{" + b" " * 5000 + b"}", 413, "too_large"),
    ],
)
async def test_bad_requests_are_refused_with_a_code(
    start_server: ServerFactory, body: bytes, status: int, code: str
) -> None:
    server = await start_server(auth="on", secret=SECRET)
    headers = {**bearer("gina"), "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(server.make_url("/api/sessions"), headers=headers, data=body) as r:
            assert r.status == status
            assert (await r.json())["code"] == code


async def test_the_api_wants_a_token(start_server: ServerFactory) -> None:
    server = await start_server(auth="on", secret=SECRET)
    async with aiohttp.ClientSession() as http:
        for method, path in [("POST", "/api/sessions"), ("GET", "/api/workers"),
                             ("GET", "/api/sessions/" + "0" * 32)]:  # fmt: skip
            async with http.request(method, server.make_url(path)) as r:
                assert r.status == 401, path
        async with http.get(server.make_url("/api/workers"), headers=bearer("w", "worker")) as r:
            assert r.status == 200  # any role may list workers
        for path in ("/healthz", "/readyz", "/metrics", "/api/openapi.json"):
            async with http.get(server.make_url(path)) as r:
                assert r.status == 200, path


async def test_the_openapi_document_describes_every_route(start_server: ServerFactory) -> None:
    server = await start_server()
    async with aiohttp.ClientSession() as http:
        async with http.get(server.make_url("/api/openapi.json")) as r:
            spec = await r.json()
    assert spec["openapi"].startswith("3.")
    documented = {
        (m.upper(), p) for p, ops in spec["paths"].items() for m in ops if m != "parameters"
    }
    served = ("/api/", "/healthz", "/readyz", "/metrics")
    routes = {
        (route.method, route.resource.canonical.replace("{session_id}", "{sessionId}"))
        for route in server.app.router.routes()
        if route.resource is not None
        and route.resource.canonical.startswith(served)
        and route.method != "HEAD"
    }
    assert routes <= documented, routes - documented
