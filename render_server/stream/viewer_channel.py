"""A viewer's `input` data channel (docs/sharing.md): what a page watching a shared session may
send, and what it is told.

A viewer may ping (its page's clock), ask for a keyframe (at most once a second, its PLIs
included: the keyframe is everyone's), send the read-only scene commands and `control.hand`;
its steering input moves the camera only while it steers (control handed to it), and is
refused `forbidden` otherwise, naming who steers. `quality` is always refused: the stream's
size and rate are the owner's. It has a rate limit of its own: a flooding viewer never eats
the owner's. Like the owner's channel (input_channel.py), nothing raises into aiortc.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from aiortc import RTCDataChannel

from render_server.logs import SessionLogger
from render_server.metrics import Metrics
from render_server.protocol.data_channel import (
    CameraInput,
    KeyframeRequest,
    PingRequest,
    QualityRequest,
    SceneCommand,
    event_type,
)
from render_server.protocol.rate_limit import TokenBucket
from render_server.protocol.timing import now_ms
from render_server.stream.input_channel import (
    INPUT_BURST,
    INPUT_RATE_PER_S,
    MOVES_CHANNEL,
    Notices,
    attach_moves,
    pong,
    read_message,
    refuse_off_moves,
    refused_channel,
    send_json,
    when_open,
)
from render_server.stream.scene_commands import SceneCommands
from render_server.transport.guard import HandlerGuard

# a viewer's steering input: applied (None), or refused with the name of who steers
Steer = Callable[[CameraInput, int | None, float], str | None]


class ViewerChannel:
    """One viewer's channel. `steer` applies its input where it steers; `control` answers its
    `control.*` commands; `on_open` is called when its channel opens (presence)."""

    def __init__(
        self,
        log: SessionLogger,
        metrics: Metrics,
        guard: HandlerGuard,
        commands: SceneCommands,
        request_keyframe: Callable[[], None],
        steer: Steer,
        control: Callable[[SceneCommand], dict[str, Any]],
        on_open: Callable[[], None],
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.guard = guard
        self.commands = commands
        self._request_keyframe = request_keyframe
        self._steer = steer
        self._control = control
        self._on_open = on_open
        self.channel: RTCDataChannel | None = None
        self.moves: RTCDataChannel | None = None  # its unordered `moves` channel, if opened
        self._bucket = TokenBucket(INPUT_RATE_PER_S, INPUT_BURST)
        self._notices = Notices()

    def attach(self, channel: RTCDataChannel) -> None:
        if channel.label == MOVES_CHANNEL:  # a viewer handed control steers through it
            self.moves = attach_moves(channel, self.moves, self.log, self.on_message)
            return
        if refused_channel(channel, self.channel, self.log):
            return
        self.channel = channel
        channel.on("message", self.on_message)
        when_open(channel, self.guard, "viewer.datachannel.open", self._on_open)

    def send(self, message: dict[str, Any]) -> None:
        send_json(self.channel, message)

    def on_message(self, message: str | bytes, moves: bool = False) -> None:
        try:
            self._on_message(message, moves)
        except Exception:
            self.metrics.input_rejected.labels("internal").inc()
            self.guard.failed("viewer.datachannel.message")
            with contextlib.suppress(Exception):
                self._error("internal", "the worker failed on this message")

    def _on_message(self, message: str | bytes, moves: bool) -> None:
        now = time.monotonic()
        if not self._bucket.take(now):
            self._refuse(now, "rate_limited", f"over {INPUT_RATE_PER_S:g} events/s")
            return
        arrived_ms = now_ms()
        read = read_message(message, self.metrics, self.send)
        if read is None:
            return
        event, seq = read
        if moves and refuse_off_moves(event, self.metrics, self.send):
            return
        if isinstance(event, PingRequest):
            self.send(pong(event, arrived_ms))
            return
        if isinstance(event, QualityRequest):
            self.metrics.input_rejected.labels("forbidden").inc()
            self._error("forbidden", "the stream's size and rate are the owner's to set")
            return
        if isinstance(event, KeyframeRequest):
            self._request_keyframe()  # rate-limited per viewer by its track
        elif isinstance(event, SceneCommand):
            if event.name.startswith("control."):
                reply = self._control(event)
            else:
                reply = self.commands.execute(event, "viewer")
            self.send(reply)
            if reply["type"] == "error":
                self.metrics.input_rejected.labels(reply["code"]).inc()
                return
        else:
            steering = self._steer(event, seq, arrived_ms)
            if steering is not None:
                self._refuse(now, "forbidden", f"{steering} steers: a viewer only watches")
            return  # counted where it was applied
        self.metrics.input_events.labels(event_type(event)).inc()

    def _refuse(self, now: float, code: str, message: str) -> None:
        """Counted each time, answered once a second (a drag is a stream of events)."""
        self.metrics.input_rejected.labels(code).inc()
        if self._notices.due(code, now):
            if code == "rate_limited":
                self.log.warning("audit.rate_limited", extra={"channel": "viewer_input"})
            self._error(code, message)

    def _error(self, code: str, message: str) -> None:
        self.send({"type": "error", "code": code, "message": message})
