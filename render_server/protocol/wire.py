"""What the JSON protocols share: the envelope, the message declarations, the field checks.

Every message is a JSON object with `v` (protocol version) and `type`. Unknown fields are
ignored so that newer peers can talk to older ones; known fields are checked strictly, and
anything malformed raises ProtocolError with a code (`errors.py`). The browser's messages are
in `signaling.py`, the worker's in `worker.py`, the replicas' bus messages in `bus.py`.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Final, TypeVar, dataclass_transform

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json

T = TypeVar("T")

PROTOCOL_VERSION: Final = 1
SUBPROTOCOL: Final = "render-server.v1"  # the WebSocket subprotocol of both sockets
MAX_MESSAGE_BYTES: Final = 64 * 1024  # an SDP offer with many candidates is a few KiB
# What a server passes on re-encoded (an offer on the bus, to the worker): `json.dumps` writes a
# 2-byte UTF-8 character as a 6-byte escape, so a message that came in at the limit may leave 3x
# as large.
RELAYED_MESSAGE_BYTES: Final = 4 * MAX_MESSAGE_BYTES
# Our messages nest 4 levels at most (session.open's iceServers' urls); a worker's free-form
# `capabilities` and `load` may nest more, and 32 is still far from json's recursion (~1000).
# A 60 KiB SDP is one string: 4096 elements leave room for any capabilities of 8 KiB.
SOCKET_JSON: Final = JsonLimits(MAX_MESSAGE_BYTES, max_depth=32, max_items=4096)
RELAYED_JSON: Final = JsonLimits(RELAYED_MESSAGE_BYTES, max_depth=32, max_items=4096)
MAX_LABELS: Final = 16
SESSION_ID: Final = re.compile(r"[0-9a-f]{32}")
NAME: Final = re.compile(r"[0-9A-Za-z._:/-]{1,64}")
MAX_NAME_CHARS: Final = 40  # a person's name (`display_name`)

Document = Mapping[str, Any]


@dataclass_transform(frozen_default=True)
class WireMessage:
    """A message: a frozen dataclass whose `type` names it on the wire, declared as

    class Offer(WireMessage, type="offer"):
        sdp: str
    """

    type: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Any]]  # what `asdict` asks of a dataclass

    def __init_subclass__(cls, *, type: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.type = type
        dataclass(frozen=True)(cls)


# -- reading --------------------------------------------------------------------------------------


def decode_document(data: str | bytes, limits: JsonLimits = SOCKET_JSON) -> dict[str, Any]:
    """Size, JSON, object and version checks of a message off a socket (`too_large`,
    `bad_json`, `bad_message`, `unsupported_version`)."""
    return check_document(read_json(data, limits))


def check_document(doc: Any, default_version: int | None = None) -> dict[str, Any]:
    """The object and version checks of a JSON value read off a socket (or the bus, where a
    document without `v` is read as `default_version`)."""
    if not isinstance(doc, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "message must be a JSON object")
    version = doc.get("v", default_version)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version!r} is not supported; "
            f"this server speaks v={PROTOCOL_VERSION}",
        )
    return doc


def parse_document(doc: Document, parsers: Mapping[str, Callable[[Document], T]]) -> T:
    """The typed message of a decoded document, by its `type`."""
    kind = doc.get("type")
    parser = parsers.get(kind) if isinstance(kind, str) else None
    if parser is None:
        known = ", ".join(sorted(parsers))
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind!r}; known: {known}"
        )
    return parser(doc)


def parse_with(data: str | bytes, parsers: Mapping[str, Callable[[Document], T]]) -> T:
    return parse_document(decode_document(data), parsers)


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_MESSAGE, message)


def optional_text(doc: Document, key: str, limit: int) -> str | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"`{key}` must be a string")
    if len(value) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{key}` is longer than {limit} characters")
    return value


def text_field(doc: Document, key: str, limit: int) -> str:
    value = optional_text(doc, key, limit)
    if value is None:
        raise _bad(f"`{key}` must be a string")
    return value


def optional_name(doc: Document, key: str) -> str | None:
    """A short name (ids, labels, regions, codecs): 1..64 of letters, digits and `._:/-`."""
    value = doc.get(key)
    if value is not None and not (isinstance(value, str) and NAME.fullmatch(value)):
        raise _bad(f"`{key}` must be a name of 1..64 characters")
    return value


def name_field(doc: Document, key: str) -> str:
    value = optional_name(doc, key)
    if value is None:
        raise _bad(f"`{key}` must be a name of 1..64 characters")
    return value


def display_name(value: object, key: str = "name") -> str:
    """A person's name as others will see it: 1..MAX_NAME_CHARS printable characters (no
    control or format characters, which could disguise it), spaces trimmed."""
    if not isinstance(value, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a string")
    name = " ".join(value.split())
    if not 0 < len(name) <= MAX_NAME_CHARS or any(unicodedata.category(c)[0] == "C" for c in name):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            f"`{key}` must be 1..{MAX_NAME_CHARS} printable characters",
        )
    return name


def labels_field(doc: Document, key: str) -> tuple[str, ...]:
    """Up to MAX_LABELS short names; absent means none."""
    labels = doc.get(key) or []
    if (
        not isinstance(labels, list)
        or len(labels) > MAX_LABELS
        or not all(isinstance(x, str) and NAME.fullmatch(x) for x in labels)
    ):
        raise _bad(f"`{key}` must be a list of at most {MAX_LABELS} short names")
    return tuple(labels)


def optional_int(doc: Document, key: str, low: int, high: int) -> int | None:
    value = doc.get(key)
    if value is not None and (type(value) is not int or not low <= value <= high):
        raise _bad(f"`{key}` must be an integer {low}..{high}")
    return value


def int_field(doc: Document, key: str, low: int, high: int, default: int | None = None) -> int:
    value = optional_int(doc, key, low, high)
    if value is None:
        if default is None:
            raise _bad(f"`{key}` must be an integer {low}..{high}")
        return default
    return value


def session_id_field(doc: Document, key: str = "sessionId") -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
        raise _bad(f"`{key}` must be a session id (32 hex digits)")
    return value


def reason_field(doc: Document, key: str = "reason") -> str:
    """A machine-readable reason or code: short text."""
    return text_field(doc, key, 64)


def json_object_field(doc: Document, key: str, limit: int) -> dict[str, Any]:
    """A free-form JSON object of at most `limit` bytes; absent means empty."""
    value = doc.get(key) or {}
    if not isinstance(value, dict):
        raise _bad(f"`{key}` must be an object")
    if len(json.dumps(value)) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{key}` is larger than {limit} bytes")
    return value


# -- writing --------------------------------------------------------------------------------------

# JSON uses the browser's spelling of WebRTC fields
_JSON_NAMES = {
    "session_id": "sessionId",
    "worker_id": "workerId",
    "resume_token": "resumeToken",
    "ice_servers": "iceServers",
    "sdp_mid": "sdpMid",
    "sdp_mline_index": "sdpMLineIndex",
    "session_ids": "sessionIds",
    "deadline_s": "deadlineS",
    "viewer_id": "viewerId",
    "expires_at": "expiresAt",
    "page_url": "pageUrl",
    "ttl_s": "ttlS",
    "qr_svg": "qrSvg",
    "max_viewers": "maxViewers",
}


def _rename(value: Any) -> Any:
    if isinstance(value, dict):
        return {_JSON_NAMES.get(k, k): _rename(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_rename(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(value)
    return value


def to_document(message: WireMessage) -> dict[str, Any]:
    """A message as the JSON object that travels (browser spelling, no nulls)."""
    return {"v": PROTOCOL_VERSION, "type": message.type, **_rename(asdict(message))}


def encode_message(message: WireMessage) -> str:
    """The JSON text of a message."""
    return json.dumps(to_document(message))
