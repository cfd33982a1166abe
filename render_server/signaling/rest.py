"""The REST API: sessions created, read and ended over HTTP, the registered workers, and the
OpenAPI document that describes them (signaling/openapi.py)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from render_server.protocol.bus import EndRequested
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import parse_requirements
from render_server.signaling.audit import audit
from render_server.signaling.auth import BROWSER_ROLES, ROLES, Identity
from render_server.signaling.context import SignalingContext
from render_server.signaling.edge import (
    MAX_REST_BODY,
    authenticate,
    ctx_of,
    http_error,
    sessions_of,
)
from render_server.signaling.openapi import OPENAPI
from render_server.signaling.state.session_store import SessionRecord


async def _json_body(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_REST_BODY:
        raise http_error(413, ErrorCode.TOO_LARGE, f"the body is over {MAX_REST_BODY} bytes")
    raw = await request.content.read(MAX_REST_BODY + 1)
    if len(raw) > MAX_REST_BODY:
        raise http_error(413, ErrorCode.TOO_LARGE, f"the body is over {MAX_REST_BODY} bytes")
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        raise http_error(400, ErrorCode.BAD_JSON, "the body is not valid JSON") from None
    if not isinstance(doc, dict):
        raise http_error(400, ErrorCode.BAD_MESSAGE, "the body must be a JSON object")
    return doc


async def _own_record(request: web.Request, identity: Identity) -> SessionRecord:
    sid = request.match_info["session_id"]
    record = await ctx_of(request).store.get(sid)
    if record is None:
        raise http_error(404, ErrorCode.UNKNOWN_SESSION, "no such session")
    if not identity.anonymous and record.owner != identity.subject:
        audit("audit.api.refused", subject=identity.subject, session=sid)
        raise http_error(403, ErrorCode.FORBIDDEN, "that session is not yours")
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
    handle, token = await sessions_of(request).create(identity.subject, identity.role, requirements)
    record = handle.record
    await handle.start()
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
    identity = authenticate(request, BROWSER_ROLES)
    record = await _own_record(request, identity)
    return web.json_response(await _describe(ctx_of(request), record))


async def delete_session(request: web.Request) -> web.Response:
    identity = authenticate(request, BROWSER_ROLES)
    ctx = ctx_of(request)
    record = await _own_record(request, identity)
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
                }
                for w in workers
            ]
        }
    )


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(OPENAPI)
