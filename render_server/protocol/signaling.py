"""Signaling wire format: versioned JSON messages, validated at the edge into typed objects.

Every message is a JSON object with `v` (protocol version) and `type`. Unknown fields are
ignored so that newer clients can talk to older servers; known fields are checked strictly.
This module holds the browser's protocol and what both protocols share; the worker's is in
`worker_protocol.py`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Final, TypeVar

from render_server.protocol.errors import CodedError
from render_server.signaling.state.registry import Requirements

T = TypeVar("T")

PROTOCOL_VERSION: Final = 1
MAX_MESSAGE_BYTES: Final = 64 * 1024  # an SDP offer with many candidates is a few KiB
MAX_SDP_CHARS: Final = 60 * 1024
MAX_CANDIDATE_CHARS: Final = 1024
MAX_MID_CHARS: Final = 64
MAX_LABELS: Final = 16
SESSION_ID: Final = re.compile(r"[0-9a-f]{32}")
RESUME_TOKEN: Final = re.compile(r"[0-9A-Za-z_-]{16,128}")
NAME: Final = re.compile(r"[0-9A-Za-z._:/-]{1,64}")
RESOLUTION: Final = re.compile(r"\d{2,5}x\d{2,5}")


class ErrorCode:
    """The `code` of an `error` message; clients branch on these, humans read `message`."""

    BAD_JSON = "bad_json"
    BAD_MESSAGE = "bad_message"
    UNKNOWN_TYPE = "unknown_type"
    UNSUPPORTED_VERSION = "unsupported_version"
    TOO_LARGE = "too_large"
    BAD_ORDER = "bad_order"
    RATE_LIMITED = "rate_limited"
    NO_CAPACITY = "no_capacity"
    BAD_OFFER = "bad_offer"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    UNKNOWN_SESSION = "unknown_session"
    WORKER_FAILED = "worker_failed"
    INTERNAL = "internal"


class ProtocolError(CodedError):
    """A message the server will not act on; sent back as an `error` message."""


# -- shared parsing -----------------------------------------------------------------------------


def decode_document(data: str | bytes) -> dict[str, Any]:
    """Size, JSON, object and version checks shared by both protocols."""
    size = len(data.encode() if isinstance(data, str) else data)
    if size > MAX_MESSAGE_BYTES:
        raise ProtocolError(
            ErrorCode.TOO_LARGE, f"message is {size} bytes; the limit is {MAX_MESSAGE_BYTES}"
        )
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.BAD_JSON, f"message is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message must be a JSON object")
    version = doc.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version!r} is not supported; "
            f"this server speaks v={PROTOCOL_VERSION}",
        )
    return doc


def parse_with(data: str | bytes, parsers: Mapping[str, Callable[[dict[str, Any]], T]]) -> T:
    doc = decode_document(data)
    kind = doc.get("type")
    parser = parsers.get(kind) if isinstance(kind, str) else None
    if parser is None:
        known = ", ".join(sorted(parsers))
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}; known: {known}"
        )
    return parser(doc)


def text_field(doc: dict[str, Any], key: str, limit: int, *, optional: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a string")
    if len(value) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{key}` is longer than {limit} characters")
    return value


def parse_session_id(doc: dict[str, Any], key: str = "sessionId") -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a session id (32 hex digits)")
    return value


def parse_sdp(doc: dict[str, Any]) -> str:
    sdp = text_field(doc, "sdp", MAX_SDP_CHARS)
    assert sdp is not None
    if not sdp.startswith("v=0"):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sdp` is not a session description (no v=0)")
    return sdp


@dataclass(frozen=True)
class IceCandidate:
    """A trickled ICE candidate; an empty `candidate` means end of candidates."""

    type: ClassVar[str] = "ice"
    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None


def parse_ice(doc: dict[str, Any]) -> IceCandidate:
    candidate = text_field(doc, "candidate", MAX_CANDIDATE_CHARS, optional=True) or ""
    if candidate and not candidate.startswith(("candidate:", "a=candidate:")):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`candidate` must start with 'candidate:'")
    mid = text_field(doc, "sdpMid", MAX_MID_CHARS, optional=True)
    index = doc.get("sdpMLineIndex")
    if index is not None and (type(index) is not int or not 0 <= index < 64):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sdpMLineIndex` must be an integer 0..63")
    return IceCandidate(candidate=candidate, sdp_mid=mid, sdp_mline_index=index)


def parse_requirements(raw: Any) -> Requirements:
    if raw is None:
        return Requirements()
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`requirements` must be an object")
    labels = raw.get("labels") or []
    if (
        not isinstance(labels, list)
        or len(labels) > MAX_LABELS
        or not all(isinstance(x, str) and NAME.fullmatch(x) for x in labels)
    ):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`requirements.labels` must be short names")
    resolution = raw.get("resolution")
    if resolution is not None and (
        not isinstance(resolution, str) or not RESOLUTION.fullmatch(resolution)
    ):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`requirements.resolution` must be WxH")
    for key in ("region", "codec"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, str) or not NAME.fullmatch(value)):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`requirements.{key}` must be a name")
    return Requirements(
        labels=frozenset(labels), region=raw.get("region"), codec=raw.get("codec"),
        resolution=resolution,
    )  # fmt: skip


# -- browser → server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionStart:
    """Ask for a session: a worker slot now (`session.started`) or a place in the queue
    (`queue` messages as it moves). `requirements` narrow the workers that fit."""

    type: ClassVar[str] = "session.start"
    requirements: Requirements = field(default_factory=Requirements)


@dataclass(frozen=True)
class SessionResume:
    """Take over a session from a socket that dropped (a reload), within the grace period,
    or attach to a session created with POST /api/sessions."""

    type: ClassVar[str] = "session.resume"
    session_id: str
    resume_token: str


@dataclass(frozen=True)
class Offer:
    """The browser's SDP offer (recvonly video + the `input` data channel)."""

    type: ClassVar[str] = "offer"
    sdp: str


@dataclass(frozen=True)
class SessionEnd:
    """End the session, or leave the queue."""

    type: ClassVar[str] = "session.end"


ClientMessage = SessionStart | SessionResume | Offer | IceCandidate | SessionEnd


def _parse_resume(doc: dict[str, Any]) -> SessionResume:
    token = doc.get("resumeToken")
    if not isinstance(token, str) or not RESUME_TOKEN.fullmatch(token):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`resumeToken` is missing or malformed")
    return SessionResume(session_id=parse_session_id(doc), resume_token=token)


_PARSERS: dict[str, Callable[[dict[str, Any]], ClientMessage]] = {
    SessionStart.type: lambda doc: SessionStart(parse_requirements(doc.get("requirements"))),
    SessionResume.type: _parse_resume,
    Offer.type: lambda doc: Offer(parse_sdp(doc)),
    IceCandidate.type: parse_ice,
    SessionEnd.type: lambda doc: SessionEnd(),
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


@dataclass(frozen=True)
class SessionStarted:
    type: ClassVar[str] = "session.started"
    session_id: str
    worker_id: str
    width: int
    height: int
    fps: float
    codec: str
    role: str = "controller"
    resume_token: str | None = None  # send it back in session.resume after a reload
    ice_servers: list[IceServer] = field(default_factory=list)


@dataclass(frozen=True)
class Queued:
    """No slot is free: the session waits; sent again whenever its position changes."""

    type: ClassVar[str] = "queue"
    session_id: str
    position: int


@dataclass(frozen=True)
class SessionInterrupted:
    """The worker went away; the session is being placed on another one (a new
    `session.started` or `queue` follows; then the client offers again)."""

    type: ClassVar[str] = "session.interrupted"
    session_id: str
    reason: str


@dataclass(frozen=True)
class Answer:
    type: ClassVar[str] = "answer"
    sdp: str


@dataclass(frozen=True)
class SessionEnded:
    type: ClassVar[str] = "session.ended"
    reason: str


@dataclass(frozen=True)
class Error:
    type: ClassVar[str] = "error"
    code: str
    message: str


ServerMessage = SessionStarted | Queued | SessionInterrupted | Answer | SessionEnded | Error

# JSON uses the browser's spelling of WebRTC fields
_JSON_NAMES = {
    "session_id": "sessionId",
    "worker_id": "workerId",
    "resume_token": "resumeToken",
    "ice_servers": "iceServers",
    "sdp_mid": "sdpMid",
    "sdp_mline_index": "sdpMLineIndex",
}


def _rename(value: Any) -> Any:
    if isinstance(value, dict):
        return {_JSON_NAMES.get(k, k): _rename(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_rename(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(value)
    return value


def to_document(message: Any) -> dict[str, Any]:
    """A message dataclass as the JSON object that travels (browser spelling, no nulls)."""
    return {"v": PROTOCOL_VERSION, "type": message.type, **_rename(asdict(message))}


def encode_message(message: Any) -> str:
    """The JSON text of a message dataclass."""
    return json.dumps(to_document(message))
