"""Designers' own models: `POST /api/scenes` stores an upload and answers its id and a ticket;
the owner lists, reads and deletes their scenes; a worker fetches a file with its worker token
and the ticket a session handed it (`GET /api/scenes/{id}/file`, protocol/scenes.py).

The body is streamed to disk as it arrives, never held: the app's `client_max_size` (64 KiB)
bounds only bodies read whole (`request.read()`/`post()`/`json()`), which the other routes do,
while this one reads `request.content` chunk by chunk up to `--max-scene-bytes`. Each read is
bounded in time too: an upload that sends nothing for STALL_S is given up.

Errors answer `{"code", "message"}` as the rest of the REST API does, with the same pair under
`"error"` too (what the page's upload code and the workers' fetch read).

A multipart/form-data body is what a page of another site may post without a preflight; the
request guard refuses a foreign Origin before this route, and a token travels only in a header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import unquote

from aiohttp import BodyPartReader, web

from render_server.config import ServerConfig
from render_server.protocol.scenes import (
    KIND_HEADER,
    SCENE_ID,
    TICKET_HEADER,
    TicketError,
    mint_ticket,
    read_ticket,
)
from render_server.signaling.audit import audit, audit_refusal
from render_server.signaling.auth import Authenticator, Identity, Role
from render_server.signaling.edge import authenticate as _authenticate
from render_server.signaling.edge import ctx_of
from render_server.signaling.scene_store import (
    SceneStore,
    StoredScene,
    StoreError,
    StoreLimits,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

SCENE_ROLES: tuple[Role, ...] = ("controller", "admin")  # who uploads, lists, reads, deletes
RAW_TYPES = frozenset({"model/gltf-binary", "model/gltf+json", "model/obj", "application/zip",
                       "application/x-zip-compressed", "application/octet-stream"})  # fmt: skip
MEDIA_TYPES = {"glb": "model/gltf-binary", "gltf": "model/gltf+json", "obj": "model/obj",
               "zip": "application/zip"}  # fmt: skip
FORM_OVERHEAD = 64 * 1024  # a multipart body's boundaries and part headers, beyond the file
CHUNK = 256 * 1024
STALL_S = 30.0  # an upload that sends nothing this long is given up


@dataclass
class SceneService:
    store: SceneStore
    ticket_key: bytes  # signs the tickets; a worker reading the folder checks them with it
    sweeper: asyncio.Task[None] | None = None


SCENE_SERVICE = web.AppKey("scene_service", SceneService)


def open_scene_service(config: ServerConfig, auth: Authenticator) -> SceneService | None:
    """The scene store of `config` (None where `scene_dir` is not set: uploads are off);
    ConfigError when the folder cannot be used. Tickets are signed with the first signing key,
    so that every replica (and a worker holding the key) reads them; without any key, with a
    key made now, good for this process only."""
    if config.scene_dir is None:
        return None
    limits = StoreLimits(
        max_file_bytes=config.max_scene_bytes, quota_bytes=config.scene_quota_bytes,
        max_scenes=config.max_scenes_per_owner, retention_s=config.scene_retention_s,
    )  # fmt: skip
    store = SceneStore.open(config.scene_dir, limits)
    key = next(iter(auth.keys.values()), None) or secrets.token_bytes(32)
    return SceneService(store, key)


def install(app: web.Application, service: SceneService | None) -> None:
    """The scene routes (answering 503 where uploads are off) and the retention sweep."""
    if service is not None:
        app[SCENE_SERVICE] = service
        app.on_startup.append(_start_sweeper)
        app.on_cleanup.append(_stop_sweeper)
    app.router.add_post("/api/scenes", upload_scene)
    app.router.add_get("/api/scenes", list_scenes)
    app.router.add_get("/api/scenes/{sceneId}", get_scene)
    app.router.add_delete("/api/scenes/{sceneId}", delete_scene)
    app.router.add_get("/api/scenes/{sceneId}/file", scene_file)


# -- answers ---------------------------------------------------------------------------------

_STATUS: dict[int, type[web.HTTPException]] = {
    400: web.HTTPBadRequest, 401: web.HTTPUnauthorized, 403: web.HTTPForbidden,
    404: web.HTTPNotFound, 408: web.HTTPRequestTimeout, 413: web.HTTPRequestEntityTooLarge,
    415: web.HTTPUnsupportedMediaType, 422: web.HTTPUnprocessableEntity,
    429: web.HTTPTooManyRequests, 503: web.HTTPServiceUnavailable,
}  # fmt: skip


def scene_error(status: int, code: str, message: str, max_bytes: int = 0) -> web.HTTPException:
    body = json.dumps({"code": code, "message": message,
                       "error": {"code": code, "message": message}})  # fmt: skip
    kwargs: dict[str, Any] = {"max_size": max_bytes} if status == 413 else {}
    return _STATUS[status](text=body, content_type="application/json", **kwargs)


def _identity(request: web.Request, roles: tuple[Role, ...]) -> Identity:
    """The caller (logged and counted by `authenticate`), refusals in this API's shape."""
    try:
        return _authenticate(request, roles)
    except web.HTTPException as exc:
        doc = json.loads(exc.text or "{}")
        code, message = doc.get("code", "unauthorized"), doc.get("message", "")
        raise scene_error(exc.status, code, message) from None


def _service(request: web.Request) -> SceneService:
    service = request.app.get(SCENE_SERVICE)
    if service is None:
        raise scene_error(503, "scenes_off", "this server takes no uploads (no --scene-dir)")
    return service


def _scene_id(request: web.Request) -> str:
    scene_id = request.match_info["sceneId"]
    if not SCENE_ID.fullmatch(scene_id):
        raise scene_error(
            404, "unknown_scene", f"{scene_id[:40]!r} is not a scene id (32 hex digits)"
        )
    return scene_id


async def _owned_scene(request: web.Request, identity: Identity) -> StoredScene:
    """The scene if it is the caller's (an admin: anyone's); 404 otherwise, not 403: whether
    another owner's id exists is none of the caller's business."""
    scene_id = _scene_id(request)
    scene = await _service(request).store.get(scene_id)
    if scene is None or not (identity.role == "admin" or scene.owner == identity.subject):
        raise scene_error(404, "unknown_scene", f"no scene {scene_id} of yours")
    return scene


def describe(service: SceneService, scene: StoredScene) -> dict[str, Any]:
    """A scene as the API shows it, with a fresh ticket that opens it."""
    return {
        "id": scene.scene_id,
        "name": scene.name,
        "kind": scene.kind,
        "bytes": scene.size,
        "created": scene.created,
        "expires": scene.created + service.store.limits.retention_s,
        "owner": scene.owner,
        "ticket": mint_ticket(service.ticket_key, scene.scene_id, scene.owner),
    }


# -- the upload ------------------------------------------------------------------------------


async def _chunks(read: Callable[[], Awaitable[bytes]]) -> AsyncGenerator[bytes, None]:
    """What `read` brings until it brings nothing, each read within STALL_S."""
    while True:
        try:
            async with asyncio.timeout(STALL_S):
                chunk = await read()
        except TimeoutError:
            raise StoreError(
                408, "upload_stalled", f"the upload sent nothing for {STALL_S:g} s: try again"
            ) from None
        except (web.RequestPayloadError, ConnectionError) as exc:
            raise StoreError(400, "bad_message", f"the upload broke off: {exc}") from None
        if not chunk:
            return
        yield chunk


async def _form_file(request: web.Request) -> tuple[str | None, AsyncGenerator[bytes, None]]:
    """The one file part of a multipart/form-data body: its name and its bytes."""
    try:
        async with asyncio.timeout(STALL_S):
            reader = await request.multipart()
            part = await reader.next()
    except TimeoutError:
        raise StoreError(408, "upload_stalled", "the form's first part did not come") from None
    except (ValueError, AssertionError, web.RequestPayloadError) as exc:
        raise StoreError(400, "bad_message", f"the form is malformed: {exc}") from None
    if not isinstance(part, BodyPartReader) or part.filename is None:
        raise StoreError(400, "bad_message", "the form holds no file: send the model as its file")
    file_part = part

    async def chunks() -> AsyncGenerator[bytes, None]:
        async for chunk in _chunks(lambda: file_part.read_chunk(CHUNK)):
            yield chunk
        try:  # before the scene is stored: a second part is refused, not ignored
            async with asyncio.timeout(STALL_S):
                extra = await reader.next()
        except (TimeoutError, ValueError, web.RequestPayloadError):
            raise StoreError(400, "bad_message", "the form does not end properly") from None
        if extra is not None:
            raise StoreError(400, "bad_message", "the form holds more than one part: send one")

    # browsers send a name's quotes and line breaks %-encoded (HTML's form encoding), and
    # aiohttp's client all of it: shown decoded
    return unquote(part.filename), chunks()


def _outcome(status: int, code: str) -> str:
    outcomes = {413: "too_large", 415: "refused", 422: "refused", 408: "broken", 400: "broken"}
    return {"too_many_uploads": "busy", "unsupported_media_type": "unsupported_type"}.get(
        code, outcomes.get(status, code)
    )


async def upload_scene(request: web.Request) -> web.Response:
    identity = _identity(request, SCENE_ROLES)
    service = _service(request)
    metrics = ctx_of(request).metrics
    store = service.store
    try:
        scene = await _receive(request, identity.subject, store)
    except StoreError as exc:
        metrics.scene_uploads.labels(_outcome(exc.status, exc.code)).inc()
        audit_refusal("audit.scene.refused", subject=identity.subject, code=exc.code,
                      reason=exc.message[:200])  # fmt: skip
        raise scene_error(exc.status, exc.code, exc.message, store.limits.max_file_bytes) from None
    metrics.scene_uploads.labels("stored").inc()
    audit("audit.scene.stored", subject=identity.subject, scene=scene.scene_id,
          kind=scene.kind, bytes=scene.size)  # fmt: skip
    return web.json_response(describe(service, scene), status=201)


async def _receive(request: web.Request, owner: str, store: SceneStore) -> StoredScene:
    declared = request.headers.get("Content-Type")
    media = request.content_type
    form = media == "multipart/form-data"
    if not declared or not (form or media in RAW_TYPES):
        raise StoreError(
            415, "unsupported_media_type",
            f"the body must be the model file (model/gltf-binary, model/gltf+json, model/obj, "
            f"application/zip) or a multipart/form-data form, not {declared or 'undeclared'}",
        )  # fmt: skip
    limit = store.limits.max_file_bytes
    length = request.content_length
    if length is not None and length > limit + (FORM_OVERHEAD if form else 0):
        raise StoreError(
            413, "too_large",
            f"the file is {length} bytes: over the upload limit of {limit} bytes "
            "(--max-scene-bytes)",
        )  # fmt: skip
    with store.uploading(owner):  # 429 beyond two at once, before a byte is read
        # the quota before a byte is read, as far as the declared length tells; again at the end
        await store.check_room(owner, length if length and not form else 1)
        if form:
            name, chunks = await _form_file(request)
        else:
            name = request.query.get("name")
            chunks = _chunks(lambda: request.content.read(CHUNK))
        async with contextlib.aclosing(chunks):  # closed at once, also when refused midway
            return await store.receive(owner, name, chunks)


# -- the owner's scenes, and a worker's fetch ------------------------------------------------


async def list_scenes(request: web.Request) -> web.Response:
    identity = _identity(request, SCENE_ROLES)
    service = _service(request)
    owner = None if identity.role == "admin" else identity.subject  # an admin sees all
    scenes = await _stored(service.store.owned(owner))
    return web.json_response({"scenes": [describe(service, s) for s in scenes]})


async def get_scene(request: web.Request) -> web.Response:
    identity = _identity(request, SCENE_ROLES)
    scene = await _stored(_owned_scene(request, identity))
    return web.json_response(describe(_service(request), scene))


async def delete_scene(request: web.Request) -> web.Response:
    identity = _identity(request, SCENE_ROLES)
    scene = await _stored(_owned_scene(request, identity))
    await _stored(_service(request).store.delete(scene.scene_id))
    audit("audit.scene.deleted", subject=identity.subject, role=identity.role,
          scene=scene.scene_id, owner=scene.owner)  # fmt: skip
    return web.json_response({"id": scene.scene_id, "deleted": True})


async def scene_file(request: web.Request) -> web.StreamResponse:
    """The file, for a worker token with a ticket that opens this scene."""
    scene_id = _scene_id(request)
    identity = _identity(request, ("worker",))
    service = _service(request)
    try:
        owner = read_ticket(service.ticket_key, request.headers.get(TICKET_HEADER), scene_id)
    except TicketError as exc:
        audit_refusal("audit.scene.ticket_refused", worker=identity.subject, scene=scene_id,
                      reason=exc.message)  # fmt: skip
        status = 401 if exc.code == "unauthorized" else 403
        raise scene_error(status, exc.code, exc.message) from None
    scene = await _stored(service.store.get(scene_id))
    if scene is None:
        raise scene_error(404, "unknown_scene", f"scene {scene_id} is not (or no longer) stored")
    if scene.owner != owner:
        raise scene_error(403, "forbidden", f"scene {scene_id} is not the ticket owner's")
    return web.FileResponse(
        service.store.file_of(scene),
        headers={KIND_HEADER: scene.kind, "Content-Type": MEDIA_TYPES[scene.kind],
                 "Cache-Control": "no-store"},
    )  # fmt: skip


async def _stored(work: Awaitable[T]) -> T:
    """`work` on the store, its refusals (a stalled disk: 503) as answers."""
    try:
        return await work
    except StoreError as exc:
        raise scene_error(exc.status, exc.code, exc.message) from None


# -- retention -------------------------------------------------------------------------------


async def _sweep_loop(store: SceneStore) -> None:
    while True:
        try:
            removed = await store.sweep()
            if removed:
                log.info("scenes.swept", extra={"removed": removed})
        except Exception:  # a disk that failed once may answer next time
            log.exception("scenes.sweep_failed")
        await asyncio.sleep(store.limits.sweep_every_s)


async def _start_sweeper(app: web.Application) -> None:
    service = app[SCENE_SERVICE]
    service.sweeper = asyncio.get_running_loop().create_task(_sweep_loop(service.store))


async def _stop_sweeper(app: web.Application) -> None:
    task = app[SCENE_SERVICE].sweeper
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
