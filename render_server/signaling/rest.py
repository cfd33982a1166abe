"""The REST API: sessions created, read and ended over HTTP, the registered workers, and the
OpenAPI document that describes them (signaling/openapi.py)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from render_server.protocol.bus import EndRequested
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json
from render_server.protocol.requirements import parse_requirements
from render_server.protocol.worker import MAX_DRAIN_S, DrainWorker, seconds_field
from render_server.signaling.access import Action, refusal
from render_server.signaling.audit import audit, audit_refusal
from render_server.signaling.auth import BROWSER_ROLES, ROLES, SESSION_ROLES, Identity, Role
from render_server.signaling.context import SignalingContext
from render_server.signaling.edge import (
    MAX_REST_BODY,
    UNSUPPORTED_MEDIA_TYPE,
    authenticate,
    client_address,
    ctx_of,
    http_error,
    sessions_of,
)
from render_server.signaling.openapi import OPENAPI
from render_server.signaling.state.session_store import SessionRecord

# a session's body nests 3 deep ({"requirements": {"labels": [...]}}); anything deeper is hostile
REST_JSON_LIMITS = JsonLimits(max_bytes=MAX_REST_BODY, max_depth=8, max_items=256)


def _check_content_type(request: web.Request) -> None:
    """A JSON endpoint takes a body of `application/json` only (415 otherwise): text/plain and
    form bodies are what a browser sends cross-site without a preflight (a "simple request"),
    so a page of another site could otherwise post to the API of a server it cannot read. A
    body without a Content-Type is refused too. (An empty body is an empty object, whatever
    its declared type: clients send `application/octet-stream` with none.)

    Should the API ever declare an upload endpoint, it accepts exactly the media types of its
    declared model and refuses everything else the same way: never "any body at all"."""
    declared = request.headers.get("Content-Type")
    if declared is None or request.content_type != "application/json":
        raise http_error(
            415, UNSUPPORTED_MEDIA_TYPE,
            f"the body must be application/json, not {declared or 'undeclared'}",
        )  # fmt: skip


async def _read_body(request: web.Request) -> bytes:
    too_large = http_error(413, ErrorCode.TOO_LARGE, f"the body is over {MAX_REST_BODY} bytes")
    if request.content_length is not None and request.content_length > MAX_REST_BODY:
        raise too_large
    body = bytearray()
    try:
        # read() returns what has arrived, not the whole body: read until its end
        while chunk := await request.content.read(MAX_REST_BODY + 1 - len(body)):
            body += chunk
            if len(body) > MAX_REST_BODY:
                raise too_large
    except web.RequestPayloadError:  # a broken chunked or compressed encoding
        raise http_error(400, ErrorCode.BAD_MESSAGE, "the body is malformed") from None
    return bytes(body)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object ({} for no body), read within REST_JSON_LIMITS."""
    raw = await _read_body(request)
    if not raw:
        return {}
    _check_content_type(request)
    if not raw.strip():
        return {}
    try:
        doc = read_json(raw, REST_JSON_LIMITS)
    except ProtocolError as exc:
        status = 413 if exc.code == ErrorCode.TOO_LARGE else 400
        raise http_error(status, exc.code, exc.message) from None
    if not isinstance(doc, dict):
        raise http_error(400, ErrorCode.BAD_MESSAGE, "the body must be a JSON object")
    return doc


async def _record_for(request: web.Request, identity: Identity, action: Action) -> SessionRecord:
    """The session's record if this token may `action` it; 404, or 403 (audited)."""
    sid = request.match_info["session_id"]
    record = await ctx_of(request).store.get(sid)
    if record is None:
        raise http_error(404, ErrorCode.UNKNOWN_SESSION, "no such session")
    reason = refusal(identity, record, action)
    if reason is not None:
        audit_refusal("audit.api.refused", subject=identity.subject, role=identity.role,
                      session=sid, action=action, reason=reason)  # fmt: skip
        raise http_error(403, ErrorCode.FORBIDDEN, reason)
    return record


async def _describe(ctx: SignalingContext, record: SessionRecord) -> dict[str, Any]:
    worker = await ctx.registry.worker_of(record.session_id)
    position = await ctx.registry.position(record.session_id)
    return {
        "sessionId": record.session_id,
        "owner": record.owner,
        "role": record.role,
        "state": "assigned" if worker else "queued" if position else "pending",
        "workerId": worker,
        "position": position,
        "requirements": record.requirements.as_dict(),
        "created": record.created,
    }


async def create_session(request: web.Request) -> web.Response:
    identity = authenticate(request, BROWSER_ROLES)
    ctx = ctx_of(request)
    body = await _json_body(request)
    try:
        requirements = parse_requirements(body.get("requirements"))
    except ProtocolError as exc:
        raise http_error(400, exc.code, exc.message) from None
    try:
        handle, token = await sessions_of(request).create(
            identity, client_address(request), requirements
        )
    except ProtocolError as exc:  # too_many_sessions: over the subject's or the address's cap
        ctx.metrics.rejected.labels(exc.code).inc()
        raise http_error(429, exc.code, exc.message) from None
    record = handle.record
    await handle.start()
    if handle.end_reason == ErrorCode.NO_CAPACITY:  # no registered worker can ever serve it
        ctx.metrics.rejected.labels(ErrorCode.NO_CAPACITY).inc()
        raise http_error(
            503, ErrorCode.NO_CAPACITY, "no registered worker can meet the requirements"
        )
    handle.detach()  # nobody is attached yet: the browser has the grace period to come
    doc = await _describe(ctx, record)
    doc.update(
        resumeToken=token,
        websocket="/ws",
        attach={"type": "session.resume", "sessionId": record.session_id, "resumeToken": token},
        attachWithinSeconds=ctx.config.resume_grace_s,
    )
    return web.json_response(doc, status=201)


async def get_session(request: web.Request) -> web.Response:
    identity = authenticate(request, SESSION_ROLES)
    record = await _record_for(request, identity, "read")
    return web.json_response(await _describe(ctx_of(request), record))


async def delete_session(request: web.Request) -> web.Response:
    identity = authenticate(request, SESSION_ROLES)
    ctx = ctx_of(request)
    record = await _record_for(request, identity, "end")
    handle = sessions_of(request).get(record.session_id)
    if handle is not None:
        await handle.end("ended_by_api")
    else:  # held by another replica: it ends it
        await ctx.channels.to_session(record.session_id, EndRequested("ended_by_api"))
    return web.json_response({"sessionId": record.session_id, "ending": True}, status=202)


async def list_workers(request: web.Request) -> web.Response:
    authenticate(request, ROLES)
    workers = await ctx_of(request).registry.workers()
    return web.json_response(
        {
            "workers": [
                {
                    "id": w.info.worker_id,
                    "slots": w.info.slots,
                    "free": w.free,
                    "labels": list(w.info.labels),
                    "region": w.info.region,
                    "capabilities": w.info.capabilities,
                    "load": w.load,
                    "draining": w.info.draining,
                }
                for w in workers
            ]
        }
    )


DRAIN_ROLES: tuple[Role, ...] = ("controller", "admin")


async def drain_worker(request: web.Request) -> web.Response:
    """Drain a worker as SIGTERM would: it takes no new session, moves each of its sessions
    to another worker and leaves. Body (optional): {"deadlineS": seconds}."""
    identity = authenticate(request, DRAIN_ROLES)
    ctx = ctx_of(request)
    body = await _json_body(request)
    deadline = None
    if body.get("deadlineS") is not None:
        try:
            deadline = seconds_field(body, "deadlineS", MAX_DRAIN_S)
        except ProtocolError as exc:
            raise http_error(400, exc.code, exc.message) from None
    worker_id = request.match_info["workerId"]
    workers = {w.info.worker_id for w in await ctx.registry.workers()}
    if worker_id not in workers:
        raise http_error(404, ErrorCode.UNKNOWN_WORKER, f"no registered worker {worker_id!r}")
    await ctx.registry.set_draining(worker_id, True)  # no new session from now on
    await ctx.channels.to_worker(worker_id, DrainWorker("api", deadline))
    audit("audit.worker.drain", worker=worker_id, subject=identity.subject, role=identity.role)
    return web.json_response({"workerId": worker_id, "draining": True}, status=202)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)
