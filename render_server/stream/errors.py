"""Names shared by the signaling side and the worker side of a session."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

SessionEndCallback = Callable[[str], Awaitable[None]]


class SessionNegotiationError(Exception):
    """The offer cannot be answered (no H.264, no video section, unparseable SDP)."""
