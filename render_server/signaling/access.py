"""Who may do what to a session, judged by the token presented, never by the session's record:
a session's owner reads it with any of its tokens and ends it with a controller token; an
admin reads and ends anyone's. (A resume takes the resuming token's role: see browser_socket.)"""

from __future__ import annotations

from typing import Literal

from render_server.signaling.auth import Identity
from render_server.signaling.state.session_store import SessionRecord

Action = Literal["read", "end"]


def refusal(identity: Identity, record: SessionRecord, action: Action) -> str | None:
    """Why `identity` may not `action` the session of `record`; None when it may."""
    if identity.role == "admin":
        return None
    if not identity.anonymous and record.owner != identity.subject:
        return "that session is not yours"
    if action == "end" and identity.role != "controller":
        return f"a {identity.role} token cannot end a session: its owner's controller can"
    return None
