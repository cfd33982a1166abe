"""Frames between a worker pool and its child processes, over a socket pair.

A frame is a 4-byte length and a pickled dict with a `kind`. Both ends are this package in
processes of one worker, started by it: nothing from outside reaches this socket, which is why
pickle (the worker protocol's own dataclasses, the config) is fine here and faster than a
round trip through JSON.
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any, Final

MAX_FRAME_BYTES: Final = 64 * 1024 * 1024
_LENGTH = struct.Struct(">I")

# parent → child
SETUP: Final = "setup"  # config, index, worker id, slots, log settings
MESSAGE: Final = "message"  # a ToWorker message for the child's service
HANDOFF: Final = "handoff"  # send `session.handoff` for one session (sid) or all (sid None)
CLOSE_ALL: Final = "close_all"  # close every session (reason)
# child → parent
READY: Final = "ready"  # warmed up (pid)
REPLY: Final = "reply"  # a SessionReply, ViewerReply or WorkerNotice for signaling
STATUS: Final = "status"  # each second: /metrics text, frames sent, session ids


class FrameError(ValueError):
    """A frame that is not one of ours (a bug, or a child that died mid-write)."""


def write_frame(writer: asyncio.StreamWriter, kind: str, **fields: Any) -> None:
    body = pickle.dumps({"kind": kind, **fields}, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_LENGTH.pack(len(body)) + body)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next frame; None at the end of the stream (the other process is gone)."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("the stream ended inside a frame's length") from None
        return None
    (length,) = _LENGTH.unpack(head)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {length} bytes (at most {MAX_FRAME_BYTES})")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise FrameError("the stream ended inside a frame") from None
    frame = pickle.loads(body)
    if not isinstance(frame, dict) or not isinstance(frame.get("kind"), str):
        raise FrameError("a frame without a kind")
    return frame
