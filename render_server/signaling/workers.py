"""What the signaling server needs of a worker: open a session, pass it SDP and candidates.

`serve` puts an in-process worker behind this; remote workers (over their own socket) are the
same protocol seen from the signaling side.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from .messages import IceCandidate

SessionEndCallback = Callable[[str], Awaitable[None]]


class SessionNegotiationError(Exception):
    """The offer cannot be answered (no H.264, no video section, unparseable SDP)."""


class WorkerSession(Protocol):
    session_id: str

    async def accept_offer(self, sdp: str) -> str:
        """The SDP answer to the browser's offer; SessionNegotiationError if there is none."""
        ...

    async def add_ice_candidate(self, candidate: IceCandidate) -> None: ...

    async def close(self, reason: str) -> None: ...


class WorkerHandle(Protocol):
    worker_id: str

    async def open_session(self, session_id: str, on_end: SessionEndCallback) -> WorkerSession:
        """A new session on a slot already claimed in the registry; `on_end` fires once."""
        ...
