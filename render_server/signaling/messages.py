"""Signaling wire format: versioned JSON messages, validated at the edge into typed objects.

Every message is a JSON object with `v` (protocol version) and `type`. Unknown fields are
ignored so that newer clients can talk to older servers; known fields are checked strictly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Final

from ..errors import CodedError

PROTOCOL_VERSION: Final = 1
MAX_MESSAGE_BYTES: Final = 64 * 1024  # an SDP offer with many candidates is a few KiB
MAX_SDP_CHARS: Final = 60 * 1024
MAX_CANDIDATE_CHARS: Final = 1024
MAX_MID_CHARS: Final = 64


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
    INTERNAL = "internal"


class ProtocolError(CodedError):
    """A message the server will not act on; sent back as an `error` message."""


# -- client → server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionStart:
    """Ask for a session: the server claims a worker slot and answers `session.started`."""

    type: ClassVar[str] = "session.start"


@dataclass(frozen=True)
class Offer:
    """The browser's SDP offer (recvonly video + the `input` data channel)."""

    type: ClassVar[str] = "offer"
    sdp: str


@dataclass(frozen=True)
class IceCandidate:
    """A trickled ICE candidate; an empty `candidate` means end of candidates."""

    type: ClassVar[str] = "ice"
    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None


@dataclass(frozen=True)
class SessionEnd:
    type: ClassVar[str] = "session.end"


ClientMessage = SessionStart | Offer | IceCandidate | SessionEnd


def _text(doc: dict[str, Any], key: str, limit: int, *, optional: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a string")
    if len(value) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{key}` is longer than {limit} characters")
    return value


def _parse_offer(doc: dict[str, Any]) -> Offer:
    sdp = _text(doc, "sdp", MAX_SDP_CHARS)
    assert sdp is not None
    if not sdp.startswith("v=0"):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sdp` is not a session description (no v=0)")
    return Offer(sdp=sdp)


def _parse_ice(doc: dict[str, Any]) -> IceCandidate:
    candidate = _text(doc, "candidate", MAX_CANDIDATE_CHARS, optional=True) or ""
    if candidate and not candidate.startswith(("candidate:", "a=candidate:")):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`candidate` must start with 'candidate:'")
    mid = _text(doc, "sdpMid", MAX_MID_CHARS, optional=True)
    index = doc.get("sdpMLineIndex")
    if index is not None and (type(index) is not int or not 0 <= index < 64):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sdpMLineIndex` must be an integer 0..63")
    return IceCandidate(candidate=candidate, sdp_mid=mid, sdp_mline_index=index)


_PARSERS: dict[str, Callable[[dict[str, Any]], ClientMessage]] = {
    SessionStart.type: lambda doc: SessionStart(),
    Offer.type: _parse_offer,
    IceCandidate.type: _parse_ice,
    SessionEnd.type: lambda doc: SessionEnd(),
}


def parse_client_message(data: str | bytes) -> ClientMessage:
    """Validate one WebSocket text message into a typed message, or raise ProtocolError."""
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
    kind = doc.get("type")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parser is None:
        known = ", ".join(sorted(_PARSERS))
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}; known: {known}"
        )
    return parser(doc)


# -- server → client ---------------------------------------------------------------------------


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
    ice_servers: list[IceServer] = field(default_factory=list)


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


ServerMessage = SessionStarted | Answer | SessionEnded | Error

# JSON uses the browser's spelling of WebRTC fields
_JSON_NAMES = {
    "session_id": "sessionId",
    "worker_id": "workerId",
    "ice_servers": "iceServers",
    "sdp_mid": "sdpMid",
    "sdp_mline_index": "sdpMLineIndex",
}


def _rename(value: Any) -> Any:
    if isinstance(value, dict):
        return {_JSON_NAMES.get(k, k): _rename(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_rename(v) for v in value]
    return value


def encode_message(message: ServerMessage | IceCandidate) -> str:
    """The JSON text of a server message."""
    return json.dumps({"v": PROTOCOL_VERSION, "type": message.type, **_rename(asdict(message))})
