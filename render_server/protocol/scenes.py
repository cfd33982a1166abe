"""Uploaded scenes between the page, signaling and workers: ids, tickets and headers.

A designer uploads a model to signaling (`POST /api/scenes`) and gets back the scene's id and a
*ticket*: a short-lived token, signed by signaling, that says "this owner's scene `id`". The page
sends both to its worker in the `loadScene` data-channel command; the worker fetches the file
with the ticket (`GET /api/scenes/{id}/file`, header `X-Scene-Ticket`), or reads it from the
shared scene folder after checking the ticket itself. The data channel reaches the worker
without signaling, so the ticket is what stops one designer loading another's model.
"""

from __future__ import annotations

import re
import time
from typing import Any, Final

import jwt

from render_server.protocol.errors import CodedError

SCENE_ID_PATTERN: Final = r"[0-9a-f]{32}"
SCENE_ID: Final = re.compile(SCENE_ID_PATTERN)
TICKET_HEADER: Final = "X-Scene-Ticket"
KIND_HEADER: Final = "X-Scene-Kind"  # the stored file's kind on GET …/file: glb, gltf, obj, zip
KINDS: Final = ("glb", "gltf", "obj", "zip")
MAX_TICKET_CHARS: Final = 2048
TICKET_TTL_S: Final = 3600.0
_AUDIENCE: Final = "render-server-scene"


def upload_reference_problem(scene_id: Any, ticket: Any) -> str | None:
    """What is wrong with an upload's id and ticket as a page hands them over (None: nothing):
    the shape only; the ticket's signature is checked where the file is read."""
    if not isinstance(scene_id, str) or not SCENE_ID.fullmatch(scene_id):
        return "`scene` must be an uploaded scene's id"
    if not isinstance(ticket, str) or not 0 < len(ticket) <= MAX_TICKET_CHARS:
        return "`ticket` must be the upload's ticket"
    return None


class TicketError(CodedError):
    """A ticket that does not open this scene: code `unauthorized` or `forbidden`."""


def mint_ticket(key: bytes, scene_id: str, owner: str, ttl_s: float = TICKET_TTL_S) -> str:
    """A ticket for `owner`'s scene `scene_id`, valid for `ttl_s` seconds."""
    if not SCENE_ID.fullmatch(scene_id):
        raise ValueError(f"not a scene id: {scene_id!r}")
    now = int(time.time())
    claims = {"scene": scene_id, "sub": owner, "aud": _AUDIENCE, "iat": now,
              "exp": now + int(ttl_s)}  # fmt: skip
    return jwt.encode(claims, key, algorithm="HS256")


def read_ticket(key: bytes, ticket: Any, scene_id: str) -> str:
    """The owner a valid ticket for `scene_id` names; TicketError otherwise."""
    if not isinstance(ticket, str) or not ticket:
        raise TicketError("unauthorized", "a scene ticket is required (the upload's `ticket`)")
    if len(ticket) > MAX_TICKET_CHARS:
        raise TicketError("unauthorized", "the scene ticket is too long")
    try:
        claims: dict[str, Any] = jwt.decode(
            ticket, key, algorithms=["HS256"], audience=_AUDIENCE, leeway=5.0,
            options={"require": ["exp", "sub", "scene"]},
        )  # fmt: skip
    except jwt.ExpiredSignatureError:
        raise TicketError("unauthorized", "the scene ticket has expired: upload again") from None
    except jwt.InvalidTokenError as exc:
        raise TicketError("unauthorized", f"the scene ticket is not valid: {exc}") from None
    if claims.get("scene") != scene_id:
        raise TicketError("forbidden", "the ticket is for another scene")
    return str(claims["sub"])
