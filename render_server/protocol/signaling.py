"""The browser's signaling protocol (WebSocket `/ws`): its messages, both directions.

The envelope, the field checks and the encoding are shared with the worker's protocol
(`wire.py`); the `error` codes are in `errors.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import Requirements, parse_requirements
from render_server.protocol.wire import (
    Document,
    WireMessage,
    display_name,
    optional_int,
    optional_text,
    parse_with,
    session_id_field,
    text_field,
)

MAX_SDP_CHARS: Final = 60 * 1024
MAX_CANDIDATE_CHARS: Final = 1024
MAX_MID_CHARS: Final = 64
RESUME_TOKEN: Final = re.compile(r"[0-9A-Za-z_-]{16,128}")
MAX_PAGE_URL_CHARS: Final = 2048
MAX_SHARE_TOKEN_CHARS: Final = 4096
SHARE_TTL_S: Final = (60, 7 * 24 * 3600)  # the shortest and longest a share link may live


# -- browser → server ---------------------------------------------------------------------------


class SessionStart(WireMessage, type="session.start"):
    """Ask for a session: a worker slot now (`session.started`) or a place in the queue
    (`queue` messages as it moves). `requirements` narrow the workers that fit."""

    requirements: Requirements = field(default_factory=Requirements)


class SessionResume(WireMessage, type="session.resume"):
    """Take over a session from a socket that dropped (a reload), within the grace period,
    or attach to a session created with POST /api/sessions."""

    session_id: str
    resume_token: str


class Offer(WireMessage, type="offer"):
    """The browser's SDP offer (recvonly video + the `input` data channel)."""

    sdp: str


class IceCandidate(WireMessage, type="ice"):
    """A trickled ICE candidate; an empty `candidate` means end of candidates."""

    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None


class SessionEnd(WireMessage, type="session.end"):
    """End the session, or leave the queue (a viewer: stop watching)."""


class SessionShare(WireMessage, type="session.share"):
    """Mint a viewer link to this socket's session (its controller only): answered with
    `session.shared`. `page_url`: the page viewers open (the link is it with `#watch=<token>`
    and the answer carries its QR code); `ttl_s`: how long the link lets viewers join."""

    page_url: str | None = None
    ttl_s: int | None = None


class SessionWatch(WireMessage, type="session.watch"):
    """Watch a shared session with a share link's `token` (answered `session.watching`; then
    offer as a controller does). `name`: how the session's other pages see this viewer."""

    token: str
    name: str | None = None


class SessionUnshare(WireMessage, type="session.unshare"):
    """Stop sharing (the session's controller only): every link minted so far opens nothing
    from now on, and every viewer's stream ends (`revoked`). Answered `session.unshared`."""


ClientMessage = (
    SessionStart
    | SessionResume
    | Offer
    | IceCandidate
    | SessionEnd
    | SessionShare
    | SessionWatch
    | SessionUnshare
)


def parse_sdp(doc: Document) -> str:
    sdp = text_field(doc, "sdp", MAX_SDP_CHARS)
    if not sdp.startswith("v=0"):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sdp` is not a session description (no v=0)")
    return sdp


def parse_ice(doc: Document) -> IceCandidate:
    candidate = optional_text(doc, "candidate", MAX_CANDIDATE_CHARS) or ""
    if candidate and not candidate.startswith(("candidate:", "a=candidate:")):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`candidate` must start with 'candidate:'")
    mid = optional_text(doc, "sdpMid", MAX_MID_CHARS)
    return IceCandidate(candidate, mid, optional_int(doc, "sdpMLineIndex", 0, 63))


def _parse_resume(doc: Document) -> SessionResume:
    token = doc.get("resumeToken")
    if not isinstance(token, str) or not RESUME_TOKEN.fullmatch(token):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`resumeToken` is missing or malformed")
    return SessionResume(session_id_field(doc), token)


def _parse_share(doc: Document) -> SessionShare:
    page_url = optional_text(doc, "pageUrl", MAX_PAGE_URL_CHARS)
    if page_url is not None and not re.fullmatch(r"https?://[^\s#]+", page_url):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`pageUrl` must be an http(s) URL without #")
    return SessionShare(page_url, optional_int(doc, "ttlS", *SHARE_TTL_S))


def _parse_watch(doc: Document) -> SessionWatch:
    token = text_field(doc, "token", MAX_SHARE_TOKEN_CHARS)
    if not token:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`token` must be a share link's token")
    name = doc.get("name")
    return SessionWatch(token, None if name is None else display_name(name))


_PARSERS: dict[str, Callable[[Document], ClientMessage]] = {
    SessionStart.type: lambda doc: SessionStart(parse_requirements(doc.get("requirements"))),
    SessionResume.type: _parse_resume,
    Offer.type: lambda doc: Offer(parse_sdp(doc)),
    IceCandidate.type: parse_ice,
    SessionEnd.type: lambda doc: SessionEnd(),
    SessionShare.type: _parse_share,
    SessionWatch.type: _parse_watch,
    SessionUnshare.type: lambda doc: SessionUnshare(),
}


def parse_client_message(data: str | bytes) -> ClientMessage:
    """Validate one browser message into a typed message, or raise ProtocolError."""
    return parse_with(data, _PARSERS)


# -- server → browser ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IceServer:
    urls: list[str]
    username: str | None = None
    credential: str | None = None


class SessionStarted(WireMessage, type="session.started"):
    session_id: str
    worker_id: str
    width: int
    height: int
    fps: float
    codec: str
    role: str = "controller"
    resume_token: str | None = None  # send it back in session.resume after a reload
    ice_servers: list[IceServer] = field(default_factory=list)


class Queued(WireMessage, type="queue"):
    """No slot is free: the session waits; sent again whenever its position changes. The first
    one carries the resume token (a waiting page that loses its socket resumes its place)."""

    session_id: str
    position: int
    resume_token: str | None = None


class SessionInterrupted(WireMessage, type="session.interrupted"):
    """The worker went away; the session is being placed on another one (a new
    `session.started` or `queue` follows; then the client offers again)."""

    session_id: str
    reason: str


class SessionMoving(WireMessage, type="session.moving"):
    """The session moves to another worker (its worker is draining), with its camera, quality
    and scene: keep showing the last frame; a `session.started` naming the new worker follows,
    then the client offers again."""

    session_id: str
    reason: str


class Answer(WireMessage, type="answer"):
    sdp: str


class SessionEnded(WireMessage, type="session.ended"):
    reason: str


class Error(WireMessage, type="error"):
    code: str
    message: str


class SessionShared(WireMessage, type="session.shared"):
    """A viewer link to the session: `token` lets its holder watch (never steer) until
    `expires_at` (Unix seconds); `url` and `qr_svg` where the page gave its `pageUrl`."""

    session_id: str
    token: str
    expires_at: int
    url: str | None = None
    qr_svg: str | None = None


class Watching(WireMessage, type="session.watching"):
    """The viewer may offer now: its id in the session's `presence`, its ICE servers. `token`:
    what to watch again with (after a move or a dropped connection) once the link has expired:
    a viewer already watching goes on; it lasts REWATCH_TTL_S from each watch."""

    session_id: str
    viewer_id: str
    ice_servers: list[IceServer] = field(default_factory=list)
    token: str | None = None


class SessionUnshared(WireMessage, type="session.unshared"):
    """The links are withdrawn and the viewers' streams ended."""

    session_id: str


class WatchEnded(WireMessage, type="viewer.ended"):
    """The viewer's stream ended or was refused (`code`: protocol/viewers.py); `retry`: watching
    again may work (the session moved, the connection dropped)."""

    code: str
    message: str
    retry: bool = False


ServerMessage = (
    SessionStarted
    | Queued
    | SessionInterrupted
    | SessionMoving
    | Answer
    | SessionEnded
    | Error
    | SessionShared
    | Watching
    | WatchEnded
    | SessionUnshared
)
