"""The OpenAPI document of the REST API, served at /api/openapi.json."""

from __future__ import annotations

from typing import Any

from render_server import __version__
from render_server.signaling.openapi_scenes import SCENE_PATHS, SCENE_SCHEMAS

_ERROR = {"$ref": "#/components/schemas/Error"}
_SESSION_PATH = "/api/sessions/{sessionId}"
_REST_CODES = ("bad_json", "bad_message", "too_large", "unauthorized", "forbidden",
               "unknown_session", "too_many_sessions", "no_capacity", "unavailable")  # fmt: skip


def _responses(ok: dict[str, Any], *codes: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(ok)
    text = {400: "Malformed request", 401: "No valid token", 403: "Not allowed for this token",
            404: "No such session (or worker)", 413: "Body too large",
            415: "The body is not application/json", 503: "Not ready"}  # fmt: skip
    for code in codes:
        out[str(code)] = _error(text[code])
    return out


def _error(description: str) -> dict[str, Any]:
    """An error response: an Error document whose `code` says which."""
    return {"description": description, "content": {"application/json": {"schema": _ERROR}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "render-server",
        "version": __version__,
        "description": "Sessions on GPU workers, streamed over WebRTC. Browsers negotiate media "
        "over the WebSocket /ws (see the README's signaling protocol); this API creates and "
        "inspects sessions and workers. Send tokens as `Authorization: Bearer <JWT>`. "
        "Roles: a controller or viewer token creates sessions and reads its subject's; ending "
        "one takes its owner's controller token; an admin token reads and ends any session and "
        "lists workers (it opens no socket). Designers upload their own models to /api/scenes "
        "(errors there carry `code` and `message` under `error` too). While the shared state "
        "(Redis) does not answer, any call answers 503 `unavailable` with `Retry-After`.",
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        "schemas": {
            "Error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {
                        "type": "string",
                        "examples": list(_REST_CODES),
                    },
                    "message": {"type": "string"},
                },
            },
            "Requirements": {
                "type": "object",
                "properties": {
                    "labels": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
                    "region": {"type": "string"},
                    "codec": {"type": "string", "examples": ["H264"]},
                    "codecs": {
                        "type": "array",
                        "items": {"type": "string", "examples": ["VP8"]},
                        "maxItems": 16,
                        "description": "the codecs the browser decodes, best first: only a "
                        "worker that sends one of them is chosen",
                    },
                    "resolution": {"type": "string", "pattern": "^[0-9]{2,5}x[0-9]{2,5}$"},
                },
            },
            "Session": {
                "type": "object",
                "required": ["sessionId", "state", "role"],
                "properties": {
                    "sessionId": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                    "owner": {"type": "string"},
                    "role": {"enum": ["controller", "viewer"]},
                    "state": {"enum": ["assigned", "queued", "pending"]},
                    "workerId": {"type": ["string", "null"]},
                    "position": {"type": ["integer", "null"]},
                    "requirements": {"$ref": "#/components/schemas/Requirements"},
                    "created": {"type": "number"},
                },
            },
            "CreatedSession": {
                "allOf": [
                    {"$ref": "#/components/schemas/Session"},
                    {
                        "type": "object",
                        "required": ["resumeToken", "websocket", "attach"],
                        "properties": {
                            "resumeToken": {"type": "string"},
                            "websocket": {"type": "string"},
                            "attach": {"type": "object"},
                            "attachWithinSeconds": {"type": "number"},
                        },
                    },
                ]
            },
            "Worker": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "slots": {"type": "integer"},
                    "free": {"type": "integer"},
                    "labels": {"type": "array", "items": {"type": "string"}},
                    "region": {"type": ["string", "null"]},
                    "capabilities": {"type": "object"},
                    "load": {"type": "object"},
                },
            },
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/api/sessions": {
            "post": {
                "summary": "Create a session: a slot now, or a place in the queue",
                "description": "Attach a browser within attachWithinSeconds by sending the "
                "`attach` message on /ws; once attached, it must send its offer within the "
                "server's offer timeout. Requirements that no registered worker can ever meet "
                "are refused at once (503 `no_capacity`); with no worker registered at all the "
                "session queues (a fleet scaling up from zero). Sessions and queue places count "
                "against the token's subject and the client address (429 `too_many_sessions`).",
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "requirements": {"$ref": "#/components/schemas/Requirements"}
                                },
                            }
                        }
                    }
                },
                "responses": _responses(
                    {
                        "201": {
                            "description": "Created",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/CreatedSession"}
                                }
                            },
                        }
                    },
                    400,
                    401,
                    403,
                    413,
                    415,
                )  # fmt: skip
                | {
                    "429": _error("too_many_sessions: the subject or address is at its cap"),
                    "503": _error("no_capacity: no registered worker can meet the requirements"),
                },
            }
        },
        _SESSION_PATH: {
            "parameters": [
                {
                    "name": "sessionId",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                }
            ],
            "get": {
                "summary": "A session of the caller's (an admin: any session)",
                "responses": _responses(
                    {
                        "200": {
                            "description": "The session",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/Session"}
                                }
                            },
                        }
                    },
                    401,
                    403,
                    404,
                ),  # fmt: skip
            },
            "delete": {
                "summary": "End a session of the caller's (or take it out of the queue)",
                "description": "Takes the owner's controller token (a viewer's is refused, "
                "403 `forbidden`) or an admin token.",
                "responses": _responses({"202": {"description": "Ending"}}, 401, 403, 404),
            },
        },
        "/api/workers": {
            "get": {
                "summary": "The registered workers, their capabilities and load",
                "responses": _responses(
                    {
                        "200": {
                            "description": "Workers",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "workers": {
                                                "type": "array",
                                                "items": {"$ref": "#/components/schemas/Worker"},
                                            }
                                        },
                                    }
                                }
                            },
                        }
                    },
                    401,
                    403,
                ),  # fmt: skip
            }
        },
        "/api/workers/{workerId}/drain": {
            "parameters": [
                {"name": "workerId", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "post": {
                "summary": "Drain a worker: no new sessions; each of its sessions moves to "
                "another worker with its camera, quality and scene; the worker then leaves",
                "description": "Takes a controller or an admin token. Body (optional): "
                '`{"deadlineS": seconds}` overrides the worker\'s --drain-timeout.',
                "requestBody": {
                    "required": False,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {
                                    "deadlineS": {"type": "number", "minimum": 0, "maximum": 3600}
                                },
                            }
                        }
                    },
                },
                "responses": _responses(
                    {"202": {"description": "Draining"}}, 400, 401, 403, 404, 415
                ),  # fmt: skip
            },
        },
        "/api/openapi.json": {
            "get": {
                "security": [],
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1"}},
            }
        },
        "/healthz": {
            "get": {
                "security": [],
                "summary": "Liveness",
                "responses": {"200": {"description": "Up"}},
            }
        },
        "/readyz": {
            "get": {
                "security": [],
                "summary": "Readiness: the registry answers",
                "responses": _responses({"200": {"description": "Ready"}}, 503),
            }
        },
        "/metrics": {
            "get": {
                "security": [],
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text/plain exposition format"}},
            }
        },
    },
}

# the uploaded scenes' routes and schemas (signaling/openapi_scenes.py)
OPENAPI["paths"].update(SCENE_PATHS)
OPENAPI["components"]["schemas"].update(SCENE_SCHEMAS)
