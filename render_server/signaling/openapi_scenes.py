"""The uploaded scenes' part of the OpenAPI document (signaling/scene_api.py), merged into
`openapi.OPENAPI`."""

from __future__ import annotations

from typing import Any

from render_server.protocol.scenes import KIND_HEADER, KINDS, SCENE_ID_PATTERN, TICKET_HEADER

_SCENE_ERROR = {"$ref": "#/components/schemas/SceneError"}
_SCENE = {"$ref": "#/components/schemas/Scene"}
_CODES = ("unauthorized", "forbidden", "unknown_scene", "too_large", "unsupported_media_type",
          "not_a_model", "bad_model", "bad_message", "upload_stalled", "too_many_uploads",
          "too_many_scenes", "over_quota", "scenes_off", "unavailable")  # fmt: skip
_TEXT = {
    400: "A malformed body (a broken form, a body that broke off)",
    401: "No valid token (or, for the file, no valid ticket)",
    403: "Not allowed for this token (a viewer's; for the file, any but a worker's, or a "
    "ticket for another scene or owner)",
    404: "No such scene of the caller's (another owner's scene is not found either)",
    408: "The upload sent nothing for 30 s",
    413: "Over --max-scene-bytes",
    415: "Not a model file (an image, a document), or a body of another media type",
    422: "A model that is broken or unsafe: a damaged glTF, a zip with a path out of it, a "
    "link, encryption, a bomb, no model or several",
    429: "Two uploads of the owner's are arriving already, or the owner's quota of bytes or "
    "scenes is full",
    503: "This server takes no uploads (no --scene-dir), or its scene folder does not answer",
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _SCENE_ERROR}}}


def _answers(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
    return {**ok, **{str(code): _error(_TEXT[code]) for code in codes}}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


SCENE_SCHEMAS: dict[str, Any] = {
    "SceneError": {
        "type": "object",
        "required": ["code", "message", "error"],
        "description": "`code` and `message`, also under `error`",
        "properties": {
            "code": {"type": "string", "examples": list(_CODES)},
            "message": {"type": "string"},
            "error": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "Scene": {
        "type": "object",
        "required": ["id", "name", "kind", "bytes", "created", "ticket"],
        "properties": {
            "id": {"type": "string", "pattern": f"^{SCENE_ID_PATTERN}$"},
            "name": {"type": "string", "description": "the uploaded file's name"},
            "kind": {"enum": list(KINDS)},
            "bytes": {"type": "integer"},
            "created": {"type": "number", "description": "seconds since the epoch"},
            "expires": {"type": "number", "description": "when the retention sweep deletes it"},
            "owner": {"type": "string"},
            "ticket": {
                "type": "string",
                "description": "opens this scene for an hour: send it with the id in the "
                "`loadScene` data-channel command",
            },
        },
    },
}

_ID_PARAMETER = {
    "name": "sceneId",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": f"^{SCENE_ID_PATTERN}$"},
}
_MODEL = {"schema": {"type": "string", "format": "binary"}}

SCENE_PATHS: dict[str, Any] = {
    "/api/scenes": {
        "post": {
            "summary": "Upload a model: a .glb, a .gltf, an .obj, or a .zip of a .gltf or .obj "
            "with its files",
            "description": "Takes a controller or admin token (with --auth off, everyone is the "
            "owner `anonymous`). The body is the file with its media type (`?name=` names it), "
            "or a multipart/form-data form with one file part. The content decides what it is, "
            "not its name or type. At most --max-scene-bytes; the owner keeps at most "
            "--max-scenes-per-owner scenes and --scene-quota bytes, each for --scene-retention "
            "seconds, and sends at most two at once.",
            "parameters": [
                {"name": "name", "in": "query", "required": False, "schema": {"type": "string"}}
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "model/gltf-binary": _MODEL,
                    "model/gltf+json": _MODEL,
                    "model/obj": _MODEL,
                    "application/zip": _MODEL,
                    "application/octet-stream": _MODEL,
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {"file": {"type": "string", "format": "binary"}},
                        }
                    },
                },
            },
            "responses": _answers(
                {"201": _json("Stored", _SCENE)}, 400, 401, 403, 408, 413, 415, 422, 429, 503
            ),
        },
        "get": {
            "summary": "The caller's scenes, newest first, each with a fresh ticket (an admin: "
            "everyone's)",
            "responses": _answers(
                {
                    "200": _json(
                        "Scenes",
                        {
                            "type": "object",
                            "properties": {"scenes": {"type": "array", "items": _SCENE}},
                        },
                    )
                },
                401,
                403,
                503,
            ),
        },
    },
    "/api/scenes/{sceneId}": {
        "parameters": [_ID_PARAMETER],
        "get": {
            "summary": "A scene of the caller's, with a fresh ticket",
            "responses": _answers({"200": _json("The scene", _SCENE)}, 401, 403, 404, 503),
        },
        "delete": {
            "summary": "Delete a scene of the caller's (an admin: anyone's)",
            "responses": _answers(
                {
                    "200": _json(
                        "Deleted",
                        {
                            "type": "object",
                            "properties": {"id": {"type": "string"}, "deleted": {"const": True}},
                        },
                    )
                },
                401,
                403,
                404,
                503,
            ),
        },
    },
    "/api/scenes/{sceneId}/file": {
        "parameters": [
            _ID_PARAMETER,
            {"name": TICKET_HEADER, "in": "header", "required": True, "schema": {"type": "string"}},
        ],  # fmt: skip
        "get": {
            "summary": "The stored file, for a worker: a worker token and the scene's ticket",
            "responses": _answers(
                {
                    "200": {
                        "description": f"The file; its kind in `{KIND_HEADER}`",
                        "headers": {KIND_HEADER: {"schema": {"enum": list(KINDS)}}},
                        "content": {"application/octet-stream": _MODEL},
                    }
                },
                401,
                403,
                404,
                503,
            ),
        },
    },
}
