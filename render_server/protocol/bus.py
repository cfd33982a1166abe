"""What signaling replicas tell each other on the bus (`signaling/state/bus.py` carries JSON
objects; `signaling/channels.py` names the channels and parses at the edge).

- A session's channel reaches the replica that holds the session (its browser's socket):
  `SessionNews`: the registry's news of it (assigned, worker lost), another socket taking it
  over (resumed), a REST call ending it, and what its worker said (`SessionReply`).
- The queue channel reaches every replica: `QueueChanged`, to tell the waiting browsers their
  place.
- A viewer's channel reaches the replica that holds the viewer's socket: `ViewerReply`, what
  the session's worker said to that viewer.
- A worker's channel reaches the replica that holds the worker (its socket, or its embedded
  worker): `WorkerRequest`, the worker protocol's requests, as the worker will get them.

Documents carry `v` as the sockets' messages do; one without it (from a replica older than these
types) is read as this version, so replicas can be upgraded one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json
from render_server.protocol.viewers import VIEWER_REPLIES, ViewerReply
from render_server.protocol.wire import (
    PROTOCOL_VERSION,
    RELAYED_MESSAGE_BYTES,
    Document,
    WireMessage,
    check_document,
    int_field,
    parse_document,
    reason_field,
    session_id_field,
    text_field,
    to_document,
)
from render_server.protocol.worker import (
    SESSION_REPLIES,
    WORKER_REQUESTS,
    SessionReply,
    WorkerRequest,
)

T = TypeVar("T")

MAX_WORKER_ID_CHARS: Final = 256  # `serve`'s own worker is named after the host: no NAME check
# The largest bus message relays a socket's message (an offer, an answer) re-encoded; they nest
# 4 levels at most (session.open's ICE servers' URLs).
BUS_JSON: Final = JsonLimits(RELAYED_MESSAGE_BYTES, max_depth=8, max_items=4096)


class Assigned(WireMessage, type="assigned"):
    """The queued session got a slot on `worker_id`: its holder opens it there."""

    session_id: str
    worker_id: str


class WorkerLost(WireMessage, type="worker_lost"):
    """The session's worker is gone: its holder places it again."""

    session_id: str
    reason: str


class Resumed(WireMessage, type="resumed"):
    """A socket took the session over; a holder of an older `generation` lets go."""

    generation: int


class EndRequested(WireMessage, type="end.requested"):
    """End the session (DELETE /api/sessions/{id} on a replica that does not hold it)."""

    reason: str


class QueueChanged(WireMessage, type="queue.changed"):
    """The queue moved: each replica tells its waiting browsers their new place."""


SessionNews = Assigned | WorkerLost | Resumed | EndRequested | SessionReply
BusMessage = SessionNews | QueueChanged | WorkerRequest | ViewerReply


def _assigned(doc: Document) -> Assigned:
    worker_id = text_field(doc, "workerId", MAX_WORKER_ID_CHARS)
    if not worker_id:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "`workerId` must not be empty")
    return Assigned(session_id_field(doc), worker_id)


_SESSION_NEWS: dict[str, Callable[[Document], SessionNews]] = {
    Assigned.type: _assigned,
    WorkerLost.type: lambda doc: WorkerLost(session_id_field(doc), reason_field(doc)),
    Resumed.type: lambda doc: Resumed(int_field(doc, "generation", 1, 2**53)),
    EndRequested.type: lambda doc: EndRequested(reason_field(doc)),
    **SESSION_REPLIES,
}
_QUEUE_NEWS: dict[str, Callable[[Document], QueueChanged]] = {
    QueueChanged.type: lambda doc: QueueChanged(),
}


def decode_bus_message(data: str | bytes) -> dict[str, Any]:
    """The JSON object a bus message travels as, off the wire (its type is checked later, by the
    parser of its channel), or ProtocolError."""
    doc = read_json(data, BUS_JSON)
    if not isinstance(doc, dict):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a bus message must be a JSON object")
    return doc


def _parse(doc: Any, parsers: Mapping[str, Callable[[Document], T]]) -> T:
    # any JSON value (a channel's parser is public): the object check, and the version, where a
    # document without `v` (an older replica's) is read as this version
    return parse_document(check_document(doc, default_version=PROTOCOL_VERSION), parsers)


def parse_session_news(doc: Any) -> SessionNews:
    """A message of a session's channel, or ProtocolError."""
    return _parse(doc, _SESSION_NEWS)


def parse_queue_news(doc: Any) -> QueueChanged:
    """A message of the queue channel, or ProtocolError."""
    return _parse(doc, _QUEUE_NEWS)


def parse_viewer_news(doc: Any) -> ViewerReply:
    """A message of a viewer's channel, or ProtocolError."""
    return _parse(doc, VIEWER_REPLIES)


def parse_worker_request(doc: Any) -> WorkerRequest:
    """A message of a worker's channel, or ProtocolError."""
    return _parse(doc, WORKER_REQUESTS)


def to_bus(message: BusMessage) -> dict[str, Any]:
    """The JSON object a bus message travels as."""
    return to_document(message)
