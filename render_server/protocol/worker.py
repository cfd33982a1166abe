"""The worker's protocol with the signaling server (WebSocket `/worker`), both directions.

Workers register with their capabilities, send heartbeats, and carry the media negotiation of
the sessions placed on them. Every message names its session; the signaling side routes only
messages for sessions the registry says the worker holds. `WorkerLink` is the same exchange
without the socket, for a worker that runs inside a signaling replica.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any, Final, Protocol

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import IceCandidate, IceServer, parse_ice, parse_sdp
from render_server.protocol.wire import (
    RELAYED_JSON,
    Document,
    WireMessage,
    decode_document,
    int_field,
    json_object_field,
    labels_field,
    name_field,
    optional_name,
    optional_text,
    parse_document,
    parse_with,
    reason_field,
    session_id_field,
    text_field,
)

MAX_SLOTS: Final = 256
MAX_CAPABILITY_BYTES: Final = 8 * 1024
ROLES: Final = ("controller", "viewer")


# -- worker → signaling -------------------------------------------------------------------------


class Register(WireMessage, type="worker.register"):
    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    region: str | None = None


class Heartbeat(WireMessage, type="worker.heartbeat"):
    sessions: int
    load: dict[str, Any] = field(default_factory=dict)


class SessionOpened(WireMessage, type="session.opened"):
    """The session is ready for an offer; what it will stream."""

    session_id: str
    width: int = 0
    height: int = 0
    fps: float = 0.0
    codec: str = "H264"


class WorkerAnswer(WireMessage, type="answer"):
    session_id: str
    sdp: str


class WorkerSessionEnded(WireMessage, type="session.ended"):
    session_id: str
    reason: str


class WorkerError(WireMessage, type="error"):
    """A session-level failure (no capacity, a bad offer); the worker ends that session."""

    session_id: str
    code: str
    message: str


# what a worker says about one of its sessions: relayed to the session's browser
SessionReply = SessionOpened | WorkerAnswer | WorkerError | WorkerSessionEnded
FromWorker = Register | Heartbeat | SessionReply


def _register(doc: Document) -> Register:
    return Register(
        worker_id=name_field(doc, "workerId"),
        slots=int_field(doc, "slots", 1, MAX_SLOTS),
        capabilities=json_object_field(doc, "capabilities", MAX_CAPABILITY_BYTES),
        labels=labels_field(doc, "labels"),
        region=optional_name(doc, "region"),
    )


def _opened(doc: Document) -> SessionOpened:
    fps = doc.get("fps", 0)
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not 0 <= fps <= 1000:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`fps` must be a number 0..1000")
    return SessionOpened(
        session_id_field(doc),
        int_field(doc, "width", 0, 16384, default=0),
        int_field(doc, "height", 0, 16384, default=0),
        float(fps),
        name_field(doc, "codec"),
    )


SESSION_REPLIES: Final[dict[str, Callable[[Document], SessionReply]]] = {
    SessionOpened.type: _opened,
    WorkerAnswer.type: lambda doc: WorkerAnswer(session_id_field(doc), parse_sdp(doc)),
    WorkerSessionEnded.type: lambda doc: WorkerSessionEnded(
        session_id_field(doc), reason_field(doc)
    ),
    WorkerError.type: lambda doc: WorkerError(
        session_id_field(doc), reason_field(doc, "code"), text_field(doc, "message", 500)
    ),
}

_FROM_WORKER: dict[str, Callable[[Document], FromWorker]] = {
    Register.type: _register,
    Heartbeat.type: lambda doc: Heartbeat(
        int_field(doc, "sessions", 0, MAX_SLOTS, default=0), json_object_field(doc, "load", 2048)
    ),
    **SESSION_REPLIES,
}


def parse_from_worker(data: str | bytes) -> FromWorker:
    return parse_with(data, _FROM_WORKER)


# -- signaling → worker -------------------------------------------------------------------------


class OpenSession(WireMessage, type="session.open"):
    session_id: str
    role: str = "controller"
    ice_servers: list[IceServer] = field(default_factory=list)


class SessionOffer(WireMessage, type="offer"):
    session_id: str
    sdp: str


class SessionIce(WireMessage, type="ice"):
    session_id: str
    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None

    @classmethod
    def of(cls, session_id: str, candidate: IceCandidate) -> SessionIce:
        return cls(session_id, candidate.candidate, candidate.sdp_mid, candidate.sdp_mline_index)

    def as_candidate(self) -> IceCandidate:
        return IceCandidate(self.candidate, self.sdp_mid, self.sdp_mline_index)


class CloseSession(WireMessage, type="session.close"):
    session_id: str
    reason: str


class Registered(WireMessage, type="worker.registered"):
    worker_id: str


# what signaling asks of a worker about one session: travels on the worker's bus channel
SessionRequest = OpenSession | SessionOffer | SessionIce | CloseSession
ToWorker = SessionRequest | Registered


def _ice_server(raw: Any) -> IceServer:
    if not isinstance(raw, dict) or not isinstance(raw.get("urls"), list):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "each ICE server needs `urls`")
    return IceServer(
        urls=[str(u)[:256] for u in raw["urls"][:8]],
        username=optional_text(raw, "username", 256),
        credential=optional_text(raw, "credential", 256),
    )


def _open(doc: Document) -> OpenSession:
    role = doc.get("role", "controller")
    if role not in ROLES:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`role` must be one of {', '.join(ROLES)}")
    servers = doc.get("iceServers") or []
    if not isinstance(servers, list):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`iceServers` must be a list")
    return OpenSession(session_id_field(doc), role, [_ice_server(raw) for raw in servers])


SESSION_REQUESTS: Final[dict[str, Callable[[Document], SessionRequest]]] = {
    OpenSession.type: _open,
    SessionOffer.type: lambda doc: SessionOffer(session_id_field(doc), parse_sdp(doc)),
    SessionIce.type: lambda doc: SessionIce.of(session_id_field(doc), parse_ice(doc)),
    CloseSession.type: lambda doc: CloseSession(session_id_field(doc), reason_field(doc)),
}

TO_WORKER: Final[dict[str, Callable[[Document], ToWorker]]] = {
    **SESSION_REQUESTS,
    Registered.type: lambda doc: Registered(name_field(doc, "workerId")),
}


def parse_to_worker(data: str | bytes) -> ToWorker:
    """A message from signaling, which may relay an offer re-encoded (hence RELAYED_JSON)."""
    return parse_document(decode_document(data, RELAYED_JSON), TO_WORKER)


# -- a worker inside a signaling replica --------------------------------------------------------


class WorkerLink(Protocol):
    """What a `/worker` socket carries, for a worker in the replica's own process (`serve`)."""

    async def open(self, registration: Register, deliver: Callable[[SessionRequest], None]) -> None:
        """Register the worker; from then on signaling's requests reach `deliver`, in order."""
        ...

    async def heartbeat(self, beat: Heartbeat) -> None: ...

    async def send(self, reply: SessionReply) -> None: ...

    async def close(self) -> None:
        """No more requests (the worker stays registered until its heartbeats stop)."""
        ...
