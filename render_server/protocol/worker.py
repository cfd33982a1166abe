"""The worker's protocol with the signaling server (WebSocket `/worker`), both directions.

Workers register with their capabilities, send heartbeats, and carry the media negotiation of
the sessions placed on them. Every message names its session; the signaling side routes only
messages for sessions the registry says the worker holds. `WorkerLink` is the same exchange
without the socket, for a worker that runs inside a signaling replica.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import field
from typing import Any, Final, Protocol

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import IceCandidate, IceServer, parse_ice, parse_sdp
from render_server.protocol.viewers import (
    VIEWER_REPLIES,
    VIEWER_REQUESTS,
    ViewerReply,
    ViewerRequest,
)
from render_server.protocol.wire import (
    RELAYED_JSON,
    Document,
    WireMessage,
    decode_document,
    display_name,
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
MAX_STATE_BYTES: Final = 16 * 1024  # a session's camera, quality and scene edits (a move)
MAX_DRAIN_S: Final = 3600.0
ROLES: Final = ("controller", "viewer")
INSTANCE: Final = re.compile(r"[0-9A-Za-z_-]{8,64}")
# `session.ended`'s reason when a worker's child process died with the session (`--processes`):
# signaling treats it as a lost worker, and places the session again
PROCESS_LOST: Final = "worker_process_lost"


# -- worker → signaling -------------------------------------------------------------------------


class Register(WireMessage, type="worker.register"):
    """`instance` is a random nonce of the worker process: the same process registering again
    (through another replica, after a dropped socket) takes its registration back, with the
    sessions it still streams (`session_ids`); another process with the same id is refused."""

    worker_id: str
    slots: int
    capabilities: dict[str, Any] = field(default_factory=dict)
    labels: tuple[str, ...] = ()
    region: str | None = None
    instance: str = ""
    session_ids: tuple[str, ...] = ()
    draining: bool = False


class Heartbeat(WireMessage, type="worker.heartbeat"):
    """`session_ids`: the sessions the worker serves now (None from a worker that does not say:
    no reconciliation); signaling frees claims it does not serve and closes those it does not
    know."""

    sessions: int
    load: dict[str, Any] = field(default_factory=dict)
    session_ids: tuple[str, ...] | None = None
    draining: bool = False


class WorkerDraining(WireMessage, type="worker.draining"):
    """The worker takes no new session from now on and hands its sessions over
    (`session.handoff` each); it leaves when empty or `deadline_s` after this."""

    reason: str
    deadline_s: float


class WorkerLeaving(WireMessage, type="worker.leaving"):
    """The worker exits now: unregister it; sessions it still held are placed elsewhere."""

    reason: str


class SessionHandoff(WireMessage, type="session.handoff"):
    """A draining worker's session, with its state (camera, quality, scene edits), to be
    opened on another worker; the worker closes it when signaling says so."""

    session_id: str
    state: dict[str, Any] = field(default_factory=dict)


class SessionOpened(WireMessage, type="session.opened"):
    """The session is ready for an offer; what it will stream. `connected`: asked again (a
    resume), the session's media is connected now: the page need not offer again."""

    session_id: str
    width: int = 0
    height: int = 0
    fps: float = 0.0
    codec: str = "H264"
    connected: bool = False


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
SessionReply = SessionOpened | WorkerAnswer | WorkerError | WorkerSessionEnded | SessionHandoff
WorkerNotice = WorkerDraining | WorkerLeaving  # about the worker itself
# everything a worker sends signaling but its registration and heartbeats
ToSignaling = SessionReply | ViewerReply | WorkerNotice
FromWorker = Register | Heartbeat | WorkerNotice | SessionReply | ViewerReply


def session_ids_field(doc: Document, key: str = "sessionIds") -> tuple[str, ...] | None:
    """Up to MAX_SLOTS session ids, distinct; None when absent."""
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_SLOTS:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a list of session ids")
    ids = tuple(session_id_field({"id": v}, "id") for v in value)
    if len(set(ids)) != len(ids):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` names a session twice")
    return ids


def bool_field(doc: Document, key: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be true or false")
    return value


def seconds_field(doc: Document, key: str, high: float) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE, f"`{key}` must be a number of seconds 0..{high:g}"
        )
    return float(value)


def _register(doc: Document) -> Register:
    instance = doc.get("instance", "")
    if not isinstance(instance, str) or (instance and not INSTANCE.fullmatch(instance)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`instance` must be 8..64 letters or digits")
    return Register(
        worker_id=name_field(doc, "workerId"),
        slots=int_field(doc, "slots", 1, MAX_SLOTS),
        capabilities=json_object_field(doc, "capabilities", MAX_CAPABILITY_BYTES),
        labels=labels_field(doc, "labels"),
        region=optional_name(doc, "region"),
        instance=instance,
        session_ids=session_ids_field(doc) or (),
        draining=bool_field(doc, "draining"),
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
        bool_field(doc, "connected"),
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
    SessionHandoff.type: lambda doc: SessionHandoff(
        session_id_field(doc), json_object_field(doc, "state", MAX_STATE_BYTES)
    ),
}

_FROM_WORKER: dict[str, Callable[[Document], FromWorker]] = {
    Register.type: _register,
    Heartbeat.type: lambda doc: Heartbeat(
        int_field(doc, "sessions", 0, MAX_SLOTS, default=0),
        json_object_field(doc, "load", 2048),
        session_ids_field(doc),
        bool_field(doc, "draining"),
    ),
    WorkerDraining.type: lambda doc: WorkerDraining(
        reason_field(doc), seconds_field(doc, "deadlineS", MAX_DRAIN_S)
    ),
    WorkerLeaving.type: lambda doc: WorkerLeaving(reason_field(doc)),
    **SESSION_REPLIES,
    **VIEWER_REPLIES,
}


def parse_from_worker(data: str | bytes) -> FromWorker:
    return parse_with(data, _FROM_WORKER)


# -- signaling → worker -------------------------------------------------------------------------


class OpenSession(WireMessage, type="session.open"):
    """`state`: what the session's previous worker handed over (a move), to start from;
    `name`: the owner's name as the session's viewers see it (presence)."""

    session_id: str
    role: str = "controller"
    ice_servers: list[IceServer] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    name: str | None = None


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


class DrainWorker(WireMessage, type="worker.drain"):
    """Drain (POST /api/workers/{id}/drain): as on SIGTERM, hand every session over and leave;
    `deadline_s` None: the worker's own --drain-timeout."""

    reason: str
    deadline_s: float | None = None


# what signaling asks of a worker about one session (its viewers' requests included)
SessionRequest = OpenSession | SessionOffer | SessionIce | CloseSession | ViewerRequest
# what travels on the worker's bus channel
WorkerRequest = SessionRequest | DrainWorker
ToWorker = WorkerRequest | Registered


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
    name = doc.get("name")
    return OpenSession(
        session_id_field(doc),
        role,
        [_ice_server(raw) for raw in servers],
        json_object_field(doc, "state", MAX_STATE_BYTES),
        None if name is None else display_name(name),
    )


def _drain(doc: Document) -> DrainWorker:
    deadline = (
        None if doc.get("deadlineS") is None else seconds_field(doc, "deadlineS", MAX_DRAIN_S)
    )
    return DrainWorker(reason_field(doc), deadline)


SESSION_REQUESTS: Final[dict[str, Callable[[Document], SessionRequest]]] = {
    OpenSession.type: _open,
    SessionOffer.type: lambda doc: SessionOffer(session_id_field(doc), parse_sdp(doc)),
    SessionIce.type: lambda doc: SessionIce.of(session_id_field(doc), parse_ice(doc)),
    CloseSession.type: lambda doc: CloseSession(session_id_field(doc), reason_field(doc)),
    **VIEWER_REQUESTS,
}

WORKER_REQUESTS: Final[dict[str, Callable[[Document], WorkerRequest]]] = {
    **SESSION_REQUESTS,
    DrainWorker.type: _drain,
}

TO_WORKER: Final[dict[str, Callable[[Document], ToWorker]]] = {
    **WORKER_REQUESTS,
    Registered.type: lambda doc: Registered(name_field(doc, "workerId")),
}


def parse_to_worker(data: str | bytes) -> ToWorker:
    """A message from signaling, which may relay an offer re-encoded (hence RELAYED_JSON)."""
    return parse_document(decode_document(data, RELAYED_JSON), TO_WORKER)


# -- a worker inside a signaling replica --------------------------------------------------------


class WorkerLink(Protocol):
    """What a `/worker` socket carries, for a worker in the replica's own process (`serve`)."""

    async def open(self, registration: Register, deliver: Callable[[WorkerRequest], None]) -> None:
        """Register the worker; from then on signaling's requests reach `deliver`, in order."""
        ...

    async def heartbeat(self, beat: Heartbeat) -> None: ...

    async def send(self, reply: ToSignaling) -> None: ...

    async def close(self) -> None:
        """No more requests (the worker stays registered until its heartbeats stop)."""
        ...
