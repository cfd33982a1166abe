"""The worker's protocol with the signaling server (WebSocket `/worker`), both directions.

Workers register with their capabilities, send heartbeats, and carry the media negotiation of
the sessions placed on them. Every message names its session; the signaling side routes only
messages for sessions the registry says the worker holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from render_server.protocol.signaling import (
    MAX_LABELS,
    NAME,
    ErrorCode,
    IceCandidate,
    IceServer,
    ProtocolError,
    parse_ice,
    parse_sdp,
    parse_session_id,
    parse_with,
    text_field,
)
from render_server.signaling.state.registry import WorkerInfo

MAX_SLOTS = 256
MAX_CAPABILITY_BYTES = 8 * 1024
ROLES = ("controller", "viewer")


# -- worker → signaling -------------------------------------------------------------------------


@dataclass(frozen=True)
class Register:
    type: ClassVar[str] = "worker.register"
    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    region: str | None = None

    def info(self, replica: str) -> WorkerInfo:
        """What the registry holds of the worker, held by signaling replica `replica`."""
        return WorkerInfo(self.worker_id, self.slots, self.capabilities, self.labels,
                          self.region, replica)  # fmt: skip


@dataclass(frozen=True)
class Heartbeat:
    type: ClassVar[str] = "worker.heartbeat"
    sessions: int
    load: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SessionOpened:
    """The session is ready for an offer; what it will stream."""

    type: ClassVar[str] = "session.opened"
    session_id: str
    width: int = 0
    height: int = 0
    fps: float = 0.0
    codec: str = "H264"


@dataclass(frozen=True)
class WorkerAnswer:
    type: ClassVar[str] = "answer"
    session_id: str
    sdp: str


@dataclass(frozen=True)
class WorkerSessionEnded:
    type: ClassVar[str] = "session.ended"
    session_id: str
    reason: str


@dataclass(frozen=True)
class WorkerError:
    """A session-level failure (no capacity, a bad offer); the worker ends that session."""

    type: ClassVar[str] = "error"
    session_id: str
    code: str
    message: str


FromWorker = Register | Heartbeat | SessionOpened | WorkerAnswer | WorkerSessionEnded | WorkerError


def _json_object(value: Any, key: str, limit: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be an object")
    if len(json.dumps(value)) > limit:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"`{key}` is larger than {limit} bytes")
    return value


def _name(doc: dict[str, Any], key: str, optional: bool = False) -> str | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a name of 1..64 characters")
    return value


def _register(doc: dict[str, Any]) -> Register:
    slots = doc.get("slots")
    if type(slots) is not int or not 1 <= slots <= MAX_SLOTS:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`slots` must be an integer 1..{MAX_SLOTS}")
    labels = doc.get("labels") or []
    if not isinstance(labels, list) or len(labels) > MAX_LABELS:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`labels` must be a list of ≤ {MAX_LABELS}")
    for label in labels:
        if not isinstance(label, str) or not NAME.fullmatch(label):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "each label must be a short name")
    worker_id = _name(doc, "workerId")
    assert worker_id is not None
    return Register(
        worker_id=worker_id,
        slots=slots,
        capabilities=_json_object(
            doc.get("capabilities") or {}, "capabilities", MAX_CAPABILITY_BYTES
        ),
        labels=tuple(labels),
        region=_name(doc, "region", optional=True),
    )


def _opened(doc: dict[str, Any]) -> SessionOpened:
    width, height, fps = doc.get("width", 0), doc.get("height", 0), doc.get("fps", 0)
    if not all(type(v) is int and 0 <= v <= 16384 for v in (width, height)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`width` and `height` must be integers")
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 <= fps <= 1000:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`fps` must be a number")
    return SessionOpened(
        parse_session_id(doc), width, height, float(fps), _name(doc, "codec") or "H264"
    )


def _heartbeat(doc: dict[str, Any]) -> Heartbeat:
    sessions = doc.get("sessions", 0)
    if type(sessions) is not int or not 0 <= sessions <= MAX_SLOTS:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`sessions` must be an integer")
    return Heartbeat(sessions, _json_object(doc.get("load") or {}, "load", 2048))


def _reason(doc: dict[str, Any], key: str = "reason") -> str:
    value = text_field(doc, key, 64)
    assert value is not None
    return value


_FROM_WORKER: dict[str, Callable[[dict[str, Any]], FromWorker]] = {
    Register.type: _register,
    Heartbeat.type: _heartbeat,
    SessionOpened.type: lambda doc: _opened(doc),
    WorkerAnswer.type: lambda doc: WorkerAnswer(parse_session_id(doc), parse_sdp(doc)),
    WorkerSessionEnded.type: lambda doc: WorkerSessionEnded(parse_session_id(doc), _reason(doc)),
    WorkerError.type: lambda doc: WorkerError(
        parse_session_id(doc), _reason(doc, "code"), text_field(doc, "message", 500) or ""
    ),
}


def parse_from_worker(data: str | bytes) -> FromWorker:
    return parse_with(data, _FROM_WORKER)


# -- signaling → worker -------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenSession:
    type: ClassVar[str] = "session.open"
    session_id: str
    role: str = "controller"
    ice_servers: list[IceServer] = field(default_factory=list)


@dataclass(frozen=True)
class SessionOffer:
    type: ClassVar[str] = "offer"
    session_id: str
    sdp: str


@dataclass(frozen=True)
class SessionIce:
    type: ClassVar[str] = "ice"
    session_id: str
    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None

    @classmethod
    def of(cls, session_id: str, candidate: IceCandidate) -> SessionIce:
        return cls(session_id, candidate.candidate, candidate.sdp_mid, candidate.sdp_mline_index)

    def as_candidate(self) -> IceCandidate:
        return IceCandidate(self.candidate, self.sdp_mid, self.sdp_mline_index)


@dataclass(frozen=True)
class CloseSession:
    type: ClassVar[str] = "session.close"
    session_id: str
    reason: str


@dataclass(frozen=True)
class Registered:
    type: ClassVar[str] = "worker.registered"
    worker_id: str


ToWorker = OpenSession | SessionOffer | SessionIce | CloseSession | Registered


def _open(doc: dict[str, Any]) -> OpenSession:
    role = doc.get("role", "controller")
    if role not in ROLES:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`role` must be one of {', '.join(ROLES)}")
    servers = []
    for raw in doc.get("iceServers") or []:
        if not isinstance(raw, dict) or not isinstance(raw.get("urls"), list):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "each ICE server needs `urls`")
        servers.append(
            IceServer(
                urls=[str(u)[:256] for u in raw["urls"][:8]],
                username=raw.get("username"),
                credential=raw.get("credential"),
            )
        )
    return OpenSession(parse_session_id(doc), role, servers)


def _ice(doc: dict[str, Any]) -> SessionIce:
    return SessionIce.of(parse_session_id(doc), parse_ice(doc))


_TO_WORKER: dict[str, Callable[[dict[str, Any]], ToWorker]] = {
    OpenSession.type: _open,
    SessionOffer.type: lambda doc: SessionOffer(parse_session_id(doc), parse_sdp(doc)),
    SessionIce.type: _ice,
    CloseSession.type: lambda doc: CloseSession(parse_session_id(doc), _reason(doc)),
    Registered.type: lambda doc: Registered(_name(doc, "workerId") or ""),
}


def parse_to_worker(data: str | bytes) -> ToWorker:
    return parse_with(data, _TO_WORKER)
