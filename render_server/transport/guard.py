"""Nothing of ours raises into aiortc, and nothing a peer sends makes aiortc's receive path raise.

aiortc runs a peer connection's and a data channel's event handlers (pyee) inside its receive
path: an exception that escapes a handler is re-raised there, ends the DTLS transport and with
it the stream (`session.peer_lost`); a coroutine handler's exception surfaces only as the
loop's "exception was never retrieved". `HandlerGuard` wraps a session's handlers: a failure is
logged (the first one of the session with its traceback, so a peer that found one cannot flood
the log) and the event dropped; the caller answers the peer where there is one to answer.

aiortc's own data-channel receive path raises too: `_data_channel_receive` decodes a text
message with `bytes.decode("utf8")` and asserts on a malformed DCEP message. `guard_data_channels`
wraps it on one SCTP transport: a text message that is not UTF-8 is handed on as binary (the
channel's JSON reader refuses it as `bad_json`), and whatever else raises there is logged and
dropped.

Checked against aiortc 1.16: `RTCSctpTransport._data_channel_receive(stream_id, pp_id, data)`,
an instance method awaited for every reassembled message, and the WebRTC PPIDs (RFC 8831).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, ParamSpec

from aiortc import RTCSctpTransport

P = ParamSpec("P")
Log = logging.Logger | logging.LoggerAdapter[logging.Logger]

WEBRTC_STRING: Final = 51  # RFC 8831 PPIDs
WEBRTC_BINARY: Final = 53


class HandlerGuard:
    """One session's wrapper of the handlers it hangs on aiortc."""

    def __init__(self, log: Log) -> None:
        self.log = log  # a session's logger: every line carries the session id
        self.failures = 0

    def failed(self, event: str) -> None:
        """Note the exception being handled (call from an `except` block)."""
        self.failures += 1
        if self.failures == 1:
            self.log.exception("session.handler_failed", extra={"event": event})
        else:
            self.log.debug("session.handler_failed", extra={"event": event, "n": self.failures})

    def sync(self, event: str, handler: Callable[P, object]) -> Callable[P, None]:
        def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                handler(*args, **kwargs)
            except Exception:
                self.failed(event)

        return guarded

    def coroutine(
        self, event: str, handler: Callable[P, Awaitable[object]]
    ) -> Callable[P, Coroutine[Any, Any, None]]:
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
            try:
                await handler(*args, **kwargs)
            except Exception:
                self.failed(event)

        return guarded


def guard_data_channels(sctp: RTCSctpTransport, guard: HandlerGuard) -> None:
    """Make `sctp`'s data-channel receive path proof against what the peer sends (idempotent)."""
    receive = sctp._data_channel_receive
    if getattr(receive, "guarded", False):
        return

    async def guarded_receive(stream_id: int, pp_id: int, data: bytes) -> None:
        if pp_id == WEBRTC_STRING:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                pp_id = WEBRTC_BINARY  # the channel's reader answers: not UTF-8
        try:
            await receive(stream_id, pp_id, data)
        except Exception:
            guard.failed("datachannel.receive")

    guarded_receive.guarded = True  # type: ignore[attr-defined]
    sctp._data_channel_receive = guarded_receive  # type: ignore[method-assign]
