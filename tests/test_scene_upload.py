"""Designers' uploads over a real signaling server (signaling/scene_api.py, scene_store.py):
stored, listed, fetched by a worker with a ticket, refused with a reason, swept."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import time
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trimesh
from aiohttp.test_utils import TestServer

from render_server.config import ConfigError, ServerConfig
from render_server.metrics import Metrics
from render_server.protocol.scenes import KIND_HEADER, TICKET_HEADER, mint_ticket, read_ticket
from render_server.signaling.app import create_app
from render_server.signaling.context import connect_context
from render_server.signaling.scene_api import SCENE_SERVICE, SceneService
from render_server.signaling.scene_store import PART_PREFIX

from .processes import SECRET, token
from .support import eventually_async

pytestmark = pytest.mark.asyncio

LIMIT = 400_000
OBJ = b"# a triangle\nmtllib tri.mtl\no tri\nv 0 0 0\nv 1 0 0\nv 0 1 0\nusemtl red\nf 1 2 3\n"
MTL = b"newmtl red\nKd 1 0 0\n"
Start = Callable[..., Awaitable[TestServer]]


def ball_glb() -> bytes:
    """Over the app's 64 KiB body limit: an upload is streamed, not read whole."""
    data = trimesh.creation.icosphere(subdivisions=4).export(file_type="glb")
    assert isinstance(data, bytes) and 64 * 1024 < len(data) < LIMIT
    return data


GLB = ball_glb()


def zip_of(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


def bearer(subject: str, role: str = "controller") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(role, subject)}"}


@pytest.fixture
def start(aiohttp_server: Any, tmp_path: Path) -> Start:
    """A signaling replica (no worker) keeping scenes in tmp_path/scenes; keyword arguments
    override ServerConfig fields."""

    async def start(**overrides: Any) -> TestServer:
        config = dataclasses.replace(
            ServerConfig(port=0, embedded_worker=False, auth="on", secret=SECRET,
                         scene_dir=tmp_path / "scenes", max_scene_bytes=LIMIT),
            **overrides,
        )  # fmt: skip
        app = create_app(await connect_context(config, Metrics()))
        return await aiohttp_server(app, host="127.0.0.1")  # type: ignore[no-any-return]

    return start


def service_of(server: TestServer) -> SceneService:
    return server.app[SCENE_SERVICE]


async def upload(
    http: aiohttp.ClientSession, server: TestServer, data: Any, subject: str = "dana",
    media: str | None = "model/gltf-binary", name: str | None = None, role: str = "controller",
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    headers = bearer(subject, role)
    if media is not None:
        headers["Content-Type"] = media
    params = {"name": name} if name else {}
    url = server.make_url("/api/scenes")
    async with http.post(url, data=data, headers=headers, params=params) as r:
        return r.status, await r.json()


def error_code(body: dict[str, Any]) -> str:
    assert body["code"] == body["error"]["code"], body  # both shapes: the REST API's, and nested
    return str(body["code"])


async def test_an_upload_is_stored_listed_read_and_deleted(start: Start) -> None:
    server = await start()
    service = service_of(server)
    async with aiohttp.ClientSession() as http:
        status, created = await upload(http, server, GLB, name="ball.glb")
        assert status == 201, created
        assert set(created) >= {"id", "name", "kind", "bytes", "created", "ticket"}
        assert (created["name"], created["kind"], created["bytes"]) == ("ball.glb", "glb", len(GLB))
        sid = created["id"]
        assert read_ticket(service.ticket_key, created["ticket"], sid) == "dana"
        folder = service.store.root / sid
        assert (folder / "model.glb").read_bytes() == GLB
        meta = json.loads((folder / "meta.json").read_text())
        assert (meta["owner"], meta["kind"], meta["bytes"]) == ("dana", "glb", len(GLB))

        scene_url = server.make_url(f"/api/scenes/{sid}")
        async with http.get(server.make_url("/api/scenes"), headers=bearer("dana")) as r:
            listed = (await r.json())["scenes"]
        assert [s["id"] for s in listed] == [sid]
        assert read_ticket(service.ticket_key, listed[0]["ticket"], sid) == "dana"
        async with http.get(scene_url, headers=bearer("dana")) as r:
            assert r.status == 200 and (await r.json())["name"] == "ball.glb"
        async with http.delete(scene_url, headers=bearer("dana")) as r:
            assert r.status == 200 and await r.json() == {"id": sid, "deleted": True}
        async with http.get(scene_url, headers=bearer("dana")) as r:
            assert r.status == 404 and error_code(await r.json()) == "unknown_scene"
        assert not folder.exists()
        async with http.get(server.make_url("/api/scenes/not-an-id"), headers=bearer("dana")) as r:
            assert r.status == 404 and "not a scene id" in (await r.json())["message"]


async def test_a_form_upload_and_a_zip_are_stored(start: Start) -> None:
    server = await start()
    async with aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("file", OBJ, filename="C:\\models\\tri.obj", content_type="model/obj")
        status, created = await upload(http, server, form, media=None)
        assert status == 201, created
        assert (created["name"], created["kind"]) == ("tri.obj", "obj")

        archive = zip_of({"tri/tri.obj": OBJ, "tri/tri.mtl": MTL})
        status, created = await upload(http, server, archive, media="application/zip")
        assert status == 201 and created["kind"] == "zip" and created["name"] == "model.zip"

        form = aiohttp.FormData()
        form.add_field("file", OBJ, filename="a.obj")
        form.add_field("file", OBJ, filename="b.obj")
        status, body = await upload(http, server, form, media=None)
        assert status == 400 and "more than one part" in body["message"]
    assert len(list(service_of(server).store.root.iterdir())) == 2  # nothing else stayed


async def test_who_may_upload_read_and_delete(start: Start) -> None:
    server = await start()
    async with aiohttp.ClientSession() as http:
        status, body = await upload(http, server, GLB, role="viewer")
        assert status == 403 and error_code(body) == "forbidden"
        async with http.post(server.make_url("/api/scenes"), data=GLB) as r:
            assert r.status == 401 and error_code(await r.json()) == "unauthorized"

        status, created = await upload(http, server, GLB, subject="dana")
        sid = created["id"]
        for method in ("GET", "DELETE"):  # another owner's id is not found, not forbidden
            url = server.make_url(f"/api/scenes/{sid}")
            async with http.request(method, url, headers=bearer("eve")) as r:
                assert r.status == 404, method
        async with http.get(server.make_url("/api/scenes"), headers=bearer("eve")) as r:
            assert (await r.json())["scenes"] == []
        async with http.get(server.make_url("/api/scenes"), headers=bearer("root", "admin")) as r:
            assert [s["owner"] for s in (await r.json())["scenes"]] == ["dana"]
        async with http.get(server.make_url(f"/api/scenes/{sid}"), headers=bearer("dana")) as r:
            assert r.status == 200  # still there


async def test_with_auth_off_everyone_is_anonymous(start: Start) -> None:
    server = await start(auth="off", secret=None)
    async with aiohttp.ClientSession() as http:
        url = server.make_url("/api/scenes")
        async with http.post(url, data=OBJ, headers={"Content-Type": "model/obj"}) as r:
            assert r.status == 201
            created = await r.json()
    assert created["owner"] == "anonymous"
    key = service_of(server).ticket_key
    assert len(key) == 32 and read_ticket(key, created["ticket"], created["id"]) == "anonymous"


async def slow_body(data: bytes, sent: list[int], go: asyncio.Event) -> AsyncIterator[bytes]:
    for chunk in (data[: len(data) // 2], data[len(data) // 2 :]):
        yield chunk
        sent.append(len(chunk))
        await asyncio.wait_for(go.wait(), 20)


def parts_left(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if p.name.startswith(PART_PREFIX)]


async def test_too_large_uploads_are_refused_and_leave_nothing(start: Start) -> None:
    server = await start()
    root = service_of(server).store.root
    async with aiohttp.ClientSession() as http:
        status, body = await upload(http, server, b"glTF" + bytes(LIMIT + 10), name="huge.glb")
        assert status == 413 and error_code(body) == "too_large"
        assert f"limit of {LIMIT} bytes" in body["message"]

        async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(LIMIT // 50_000 + 2):
                yield b"v 0 0 0\n" * 6250

        status, body = await upload(http, server, streamed(), media="model/obj")
        assert status == 413 and "limit" in body["message"], body
    assert list(root.iterdir()) == []
    assert 'signaling_scene_uploads_total{outcome="too_large"} 2.0' in await metrics_of(server)


BAD_UPLOADS = [
    # (name, bytes, status, code, words the message holds)
    ("photo.glb", b"\x89PNG\r\n\x1a\n" + b"\0" * 2000, 415, "not_a_model",
     "photo.glb: this is a PNG image, not a 3D model: upload .glb"),
    ("bomb.zip", zip_of({"model.obj": b"v 0 0 0\n" + b"#" * 3_000_000}), 422, "bad_model",
     "zip bomb"),
    ("escape.zip", zip_of({"../../escape.obj": OBJ}), 422, "bad_model", "points outside"),
    ("two.zip", zip_of({"a.obj": OBJ, "b.obj": OBJ}), 422, "bad_model", "holds 2 models"),
    ("none.zip", zip_of({"readme.txt": b"hello"}), 422, "bad_model", "holds no model"),
    ("broken.glb", b"glTF\x02\x00\x00\x00\x10\x00\x00\x00abcd", 422, "bad_model", "JSON"),
]  # fmt: skip


def symlink_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("tri.obj", OBJ)
        link = zipfile.ZipInfo("tri.mtl")
        link.external_attr = 0o120777 << 16  # a symbolic link
        archive.writestr(link, "/etc/passwd")
    return out.getvalue()


@pytest.mark.parametrize(
    ("name", "data", "status", "code", "words"),
    [*BAD_UPLOADS, ("link.zip", symlink_zip(), 422, "bad_model", "symbolic link")],
)
async def test_what_is_no_safe_model_is_refused_with_its_reason(
    start: Start, name: str, data: bytes, status: int, code: str, words: str
) -> None:
    server = await start()
    async with aiohttp.ClientSession() as http:
        got, body = await upload(http, server, data, name=name, media="application/octet-stream")
        assert (got, error_code(body)) == (status, code), body
        assert words in body["message"], body["message"]
    assert list(service_of(server).store.root.iterdir()) == []
    assert 'signaling_scene_uploads_total{outcome="refused"} 1.0' in await metrics_of(server)


async def test_a_body_of_another_type_is_refused(start: Start) -> None:
    server = await start()
    async with aiohttp.ClientSession() as http:
        for media in ("text/plain", "application/json", None):
            status, body = await upload(http, server, OBJ, media=media or "")
            assert status == 415 and error_code(body) == "unsupported_media_type", media


async def test_quotas_of_bytes_and_scenes(start: Start) -> None:
    server = await start(scene_quota_bytes=len(GLB) + len(OBJ), max_scenes_per_owner=2)
    async with aiohttp.ClientSession() as http:
        assert (await upload(http, server, GLB))[0] == 201
        status, body = await upload(http, server, GLB)  # its declared length is over the quota
        assert status == 429 and error_code(body) == "over_quota", body
        assert (await upload(http, server, OBJ, media="model/obj"))[0] == 201
        status, body = await upload(http, server, b"# \n" + OBJ[:10], media="model/obj")
        assert status == 429 and error_code(body) == "too_many_scenes", body
        assert (await upload(http, server, GLB, subject="eve"))[0] == 201  # quotas are per owner
    metrics = await metrics_of(server)
    assert 'outcome="over_quota"} 1.0' in metrics and 'outcome="stored"} 3.0' in metrics


async def test_a_third_upload_at_once_is_refused(start: Start) -> None:
    server = await start()
    store = service_of(server).store
    go = asyncio.Event()
    sent: list[int] = []
    async with aiohttp.ClientSession() as http:
        slow = [asyncio.create_task(upload(http, server, slow_body(GLB, sent, go)))
                for _ in range(2)]  # fmt: skip
        await eventually_async(lambda: store.in_flight("dana") == 2 and len(sent) == 2)
        status, body = await upload(http, server, GLB)
        assert status == 429 and error_code(body) == "too_many_uploads", body
        assert (await upload(http, server, GLB, subject="eve"))[0] == 201  # others go on
        go.set()
        results = await asyncio.wait_for(asyncio.gather(*slow), 30)
    assert [status for status, _ in results] == [201, 201]
    assert store.in_flight("dana") == 0
    assert 'outcome="busy"} 1.0' in await metrics_of(server)


async def test_a_worker_fetches_the_file_with_its_ticket(start: Start) -> None:
    server = await start()
    key = service_of(server).ticket_key
    async with aiohttp.ClientSession() as http:
        _, dana = await upload(http, server, GLB)
        _, eve = await upload(http, server, OBJ, subject="eve", media="model/obj")
        url = server.make_url(f"/api/scenes/{dana['id']}/file")
        worker = bearer("worker-1", "worker")

        async def fetch(headers: dict[str, str]) -> tuple[int, bytes, aiohttp.ClientResponse]:
            async with http.get(url, headers=headers) as r:
                return r.status, await r.read(), r

        status, body, answer = await fetch({**worker, TICKET_HEADER: dana["ticket"]})
        assert status == 200 and body == GLB
        assert answer.headers[KIND_HEADER] == "glb"

        refusals = [
            ({**worker}, 401, "a scene ticket is required"),
            ({**worker, TICKET_HEADER: eve["ticket"]}, 403, "another scene"),
            ({**worker, TICKET_HEADER: mint_ticket(key, dana["id"], "eve")}, 403, "owner"),
            ({**worker, TICKET_HEADER: mint_ticket(b"k" * 32, dana["id"], "dana")}, 401, "valid"),
            ({**bearer("dana"), TICKET_HEADER: dana["ticket"]}, 403, "controller token"),
            ({TICKET_HEADER: dana["ticket"]}, 401, "token is required"),
        ]
        for headers, want, words in refusals:
            status, body, _ = await fetch(headers)
            message = json.loads(body)["error"]["message"]
            assert (status, words in message) == (want, True), (headers.keys(), message)


async def test_old_scenes_are_swept(start: Start) -> None:
    server = await start(scene_retention_s=3600)
    store = service_of(server).store
    async with aiohttp.ClientSession() as http:
        _, created = await upload(http, server, GLB)
        leftover = store.root / f"{PART_PREFIX}crashed.part"
        leftover.write_bytes(b"half")
        assert await store.sweep() == 0 and (store.root / created["id"]).exists()
        assert await store.sweep(now=time.time() + 3601) == 1  # older than the retention
        assert list(store.root.iterdir()) == []  # the crashed upload's part went too
        async with http.get(server.make_url(f"/api/scenes/{created['id']}"),
                            headers=bearer("dana")) as r:  # fmt: skip
            assert r.status == 404


async def test_the_server_sweeps_on_its_own(start: Start) -> None:
    server = await start(scene_retention_s=1)
    store = service_of(server).store
    async with aiohttp.ClientSession() as http:
        status, created = await upload(http, server, OBJ, media="model/obj")
        assert status == 201
    folder = store.root / created["id"]
    await eventually_async(lambda: not folder.exists(), timeout=15, what="the sweep")


async def test_uploads_off_and_an_unusable_folder(start: Start, tmp_path: Path) -> None:
    server = await start(scene_dir=None)
    assert SCENE_SERVICE not in server.app
    async with aiohttp.ClientSession() as http:
        status, body = await upload(http, server, GLB)
        assert status == 503 and error_code(body) == "scenes_off"
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    with pytest.raises(ConfigError, match="--scene-dir .*file.* is not a writable folder"):
        await start(scene_dir=not_a_folder / "scenes")


async def metrics_of(server: TestServer) -> str:
    async with aiohttp.ClientSession() as http, http.get(server.make_url("/metrics")) as r:
        return await r.text()


async def test_an_upload_that_stalls_is_given_up(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    from render_server.signaling import scene_api

    monkeypatch.setattr(scene_api, "STALL_S", 0.3)
    server = await start()

    async def stalling() -> AsyncIterator[bytes]:
        yield GLB[:1000]
        await asyncio.sleep(2)  # the server gives up long before

    async with aiohttp.ClientSession() as http:
        status, body = await upload(http, server, stalling())
        assert status == 408 and error_code(body) == "upload_stalled", body
    assert list(service_of(server).store.root.iterdir()) == []
    assert service_of(server).store.in_flight("dana") == 0
    assert 'outcome="broken"} 1.0' in await metrics_of(server)
