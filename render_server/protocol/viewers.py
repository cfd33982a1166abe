"""A shared session's viewers between signaling and the worker (the worker protocol's part).

A viewer watches someone else's session: its page opens `/ws` with a share link's token, sends
`session.watch`, and offers like a controller does (protocol/signaling.py). Signaling names the
viewer (`viewer_id`, 32 hex digits) and relays its offer, candidates and leaving to the worker
that holds the session; the worker answers on the viewer's own bus channel. The worker sends
the session's encoded frames to every viewer's peer connection: one encode, many peers
(stream/viewers.py). Every message names its session and its viewer: signaling routes only
messages for sessions the registry says the worker holds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import IceCandidate, parse_ice, parse_sdp
from render_server.protocol.wire import (
    Document,
    WireMessage,
    display_name,
    reason_field,
    session_id_field,
    text_field,
)

OWNER_PEER: Final = "owner"  # the peer id of the session's own page, in `presence`
VIEWER_ID: Final = re.compile(r"[0-9a-f]{32}")

# why a viewer's stream ended (`viewer.ended`'s `code`); the page may watch again after the
# ones in RETRYABLE_ENDINGS
SESSION_ENDED: Final = "session_ended"
MOVED: Final = "moved"  # the session moves to another worker: watch again there
TOO_MANY_VIEWERS: Final = "too_many_viewers"
SHARING_OFF: Final = "sharing_off"
PEER_LOST: Final = "peer_lost"  # its connection failed, went silent, or never connected
LEFT: Final = "left"  # the page left (`session.end`, its socket closed)
REVOKED: Final = "revoked"  # the owner stopped sharing
REMOVED: Final = "removed"  # the owner removed this viewer (`control.remove`)
RETRYABLE_ENDINGS: Final = frozenset({MOVED, PEER_LOST, "worker_lost", "not_streaming"})


def viewer_id_field(doc: Document, key: str = "viewerId") -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not VIEWER_ID.fullmatch(value):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"`{key}` must be a viewer id (32 hex digits)")
    return value


# -- signaling → worker ---------------------------------------------------------------------------


class ViewerOffer(WireMessage, type="viewer.offer"):
    """A viewer's offer: the worker answers (`viewer.answer`) or refuses (`viewer.ended`)."""

    session_id: str
    viewer_id: str
    sdp: str
    name: str


class ViewerIce(WireMessage, type="viewer.ice"):
    session_id: str
    viewer_id: str
    candidate: str
    sdp_mid: str | None = None
    sdp_mline_index: int | None = None

    @classmethod
    def of(cls, session_id: str, viewer_id: str, candidate: IceCandidate) -> ViewerIce:
        return cls(
            session_id, viewer_id, candidate.candidate, candidate.sdp_mid,
            candidate.sdp_mline_index,
        )  # fmt: skip

    def as_candidate(self) -> IceCandidate:
        return IceCandidate(self.candidate, self.sdp_mid, self.sdp_mline_index)


class ViewerLeave(WireMessage, type="viewer.leave"):
    """The viewer's page left: its peer connection is closed (no answer)."""

    session_id: str
    viewer_id: str
    reason: str


class ViewersEnd(WireMessage, type="viewers.end"):
    """End every viewer's stream of the session (the owner stopped sharing): each is told
    `viewer.ended` with `code`."""

    session_id: str
    code: str
    message: str


ViewerRequest = ViewerOffer | ViewerIce | ViewerLeave | ViewersEnd


def _ice(doc: Document) -> ViewerIce:
    return ViewerIce.of(session_id_field(doc), viewer_id_field(doc), parse_ice(doc))


VIEWER_REQUESTS: Final[dict[str, Callable[[Document], ViewerRequest]]] = {
    ViewerOffer.type: lambda doc: ViewerOffer(
        session_id_field(doc),
        viewer_id_field(doc),
        parse_sdp(doc),
        display_name(doc.get("name")),
    ),  # fmt: skip
    ViewerIce.type: _ice,
    ViewerLeave.type: lambda doc: ViewerLeave(
        session_id_field(doc), viewer_id_field(doc), reason_field(doc)
    ),
    ViewersEnd.type: lambda doc: ViewersEnd(
        session_id_field(doc), reason_field(doc, "code"), text_field(doc, "message", 500)
    ),
}


# -- worker → signaling (→ the viewer's page) -----------------------------------------------------


class ViewerAnswer(WireMessage, type="viewer.answer"):
    session_id: str
    viewer_id: str
    sdp: str


class ViewerEnded(WireMessage, type="viewer.ended"):
    """The viewer's stream ended or was refused: `code` says why (the constants above),
    `message` says it to a person."""

    session_id: str
    viewer_id: str
    code: str
    message: str


ViewerReply = ViewerAnswer | ViewerEnded

VIEWER_REPLIES: Final[dict[str, Callable[[Document], ViewerReply]]] = {
    ViewerAnswer.type: lambda doc: ViewerAnswer(
        session_id_field(doc), viewer_id_field(doc), parse_sdp(doc)
    ),
    ViewerEnded.type: lambda doc: ViewerEnded(
        session_id_field(doc),
        viewer_id_field(doc),
        reason_field(doc, "code"),
        text_field(doc, "message", 500),
    ),  # fmt: skip
}
