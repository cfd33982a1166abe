"""A session's `input` data channel (and its unordered `moves` channel, where the page opens
one): what arrives on them, what that does, what is answered.

Input events steer the camera (a controller's only); anyone may ping (the page's clock), ask for
a keyframe, set its own stream's quality and send read-only scene commands; the other commands
are a controller's (docs/data-channel.md). Every message counts against a rate limit; whatever
is refused changes nothing, is answered with an error and counted in /metrics. Nothing raises
into aiortc, which calls these handlers: a failure of ours is answered `internal`, logged once
per session, and the stream goes on (`transport/guard.py`).

The channel belongs to one peer connection, this object to the session: quality, rate limit and
input sequence carry over to the next peer (a reload).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from aiortc import RTCDataChannel

from render_server.config import Resolution
from render_server.logs import SessionLogger
from render_server.metrics import Metrics
from render_server.protocol.data_channel import (
    CameraInput,
    CommandError,
    InputError,
    InputEvent,
    KeyframeRequest,
    PingRequest,
    PointerEvent,
    QualityRequest,
    SceneCommand,
    WheelEvent,
    event_type,
    parse_message,
)
from render_server.protocol.rate_limit import TokenBucket
from render_server.protocol.timing import now_ms
from render_server.render.camera import OrbitCamera
from render_server.stream.bandwidth_steps import FULL, Step
from render_server.stream.controls import CameraController
from render_server.stream.pipeline import FramePipeline
from render_server.stream.quality import QualityLimits, StreamQuality
from render_server.stream.scene_commands import SceneCommands, error_reply
from render_server.transport.guard import HandlerGuard

INPUT_CHANNEL = "input"  # the label of the data channel of everything a page sends
# ...and of the one for pointer moves and wheel turns alone, which a page opens unordered: over
# a lossy path, a lost packet of an ordered channel holds every later move until it is resent
# (a round trip and more: the camera stops, and the worker repeats a still picture), where an
# unordered channel hands each move on as it comes. Moves carry deltas, so order does not
# matter; `seq` only ever advances.
MOVES_CHANNEL = "moves"
INPUT_RATE_PER_S = 500.0  # a 1000 Hz gaming mouse coalesced by the browser stays well below
INPUT_BURST = 200
NOTICE_EVERY_S = 1.0  # refusals of a stream of events (a drag): one error message a second


class Notices:
    """Refusals of a stream of events (a drag, a flood): each code answered at most once per
    NOTICE_EVERY_S, however often it is counted."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def due(self, code: str, now: float) -> bool:
        if now - self._at.get(code, -float("inf")) < NOTICE_EVERY_S:
            return False
        self._at[code] = now
        return True


def refused_channel(
    channel: RTCDataChannel,
    held: RTCDataChannel | None,
    log: SessionLogger,
    label: str = INPUT_CHANNEL,
) -> bool:
    """Close `channel` unless it is the peer's first one labelled `label` (`held`: the one
    taken already, if any); True when it was refused."""
    if channel.label == label and held is None:
        return False
    log.warning("datachannel.refused", extra={"label": channel.label[:64]})
    channel.close()
    return True


def attach_moves(
    channel: RTCDataChannel,
    held: RTCDataChannel | None,
    log: SessionLogger,
    on_message: Callable[..., None],
) -> RTCDataChannel | None:
    """The peer's `moves` channel once `channel` (labelled so) is taken as it, its messages
    going to `on_message(message, moves=True)`; `held` where it was refused."""
    if refused_channel(channel, held, log, MOVES_CHANNEL):
        return held
    channel.on("message", partial(on_message, moves=True))
    return channel


def carries_moves(event: InputEvent) -> bool:
    """What the `moves` channel may carry: deltas, whose order does not matter."""
    return isinstance(event, WheelEvent) or (
        isinstance(event, PointerEvent) and event.action == "move"
    )


def refuse_off_moves(
    event: InputEvent, metrics: Metrics, send: Callable[[dict[str, Any]], None]
) -> bool:
    """True (refused, counted and answered) for an event the `moves` channel may not carry."""
    if carries_moves(event):
        return False
    metrics.input_rejected.labels("wrong_channel").inc()
    send({"type": "error", "code": "wrong_channel",
          "message": f"only pointer moves and wheel turns go on `{MOVES_CHANNEL}`; "
                     f"send `{event_type(event)}` on `{INPUT_CHANNEL}`"})  # fmt: skip
    return True


def when_open(
    channel: RTCDataChannel, guard: HandlerGuard, name: str, callback: Callable[[], None]
) -> None:
    """`callback` now if the channel is open (a remote channel is when aiortc announces it),
    else once it opens."""
    if channel.readyState == "open":
        callback()
    else:
        channel.once("open", guard.sync(name, callback))


def send_json(channel: RTCDataChannel | None, message: dict[str, Any]) -> None:
    """Send `message` if the channel is open (else it is dropped: nobody listens)."""
    if channel is not None and channel.readyState == "open":
        channel.send(json.dumps(message))


def read_message(
    message: str | bytes, metrics: Metrics, send: Callable[[dict[str, Any]], None]
) -> tuple[InputEvent, int | None] | None:
    """A page's message as an event and its `seq`; None for one refused (answered on `send`
    and counted)."""
    try:
        return parse_message(message)
    except CommandError as exc:
        metrics.input_rejected.labels(exc.code).inc()
        send(error_reply(exc, exc.id))
    except InputError as exc:
        metrics.input_rejected.labels(exc.code).inc()
        send({"type": "error", "code": exc.code, "message": exc.message})
    return None


def pong(ping: PingRequest, arrived_ms: float) -> dict[str, Any]:
    """A `ping`'s answer: the page's clock back, and when the worker had it (clock alignment)."""
    return {"type": "pong", "id": ping.id, "t": ping.t, "w": round(arrived_ms, 3)}


class InputChannel:
    """Dispatches the `input` channel's messages and sends the session's messages on it.

    `on_fps` is called when the page asks for another frame rate, `on_steer` when input moved
    the camera (a frame should start now rather than at the next tick). A shared session's
    viewers (stream/viewers.py) hang three hooks here: `on_open` (the page's channel opened),
    `steered_by` (who steers instead of this page, None while it does) and `on_control` (the
    `control.*` commands).
    """

    def __init__(
        self,
        role: str,
        log: SessionLogger,
        metrics: Metrics,
        pipeline: FramePipeline,
        controller: CameraController,
        commands: SceneCommands,
        quality: StreamQuality,
        quality_limits: QualityLimits,
        on_fps: Callable[[float], None],
        on_steer: Callable[[], None],
    ) -> None:
        self.role = role
        self.log = log
        self.metrics = metrics
        self.pipeline = pipeline
        self.controller = controller
        self.commands = commands
        self.quality = quality
        self.quality_limits = quality_limits
        self._worker_limits = quality_limits  # before any codec's limits (`limit_codec`)
        self._on_fps = on_fps
        self._on_steer = on_steer
        self.channel: RTCDataChannel | None = None  # the current peer's
        self.moves: RTCDataChannel | None = None  # its `moves` channel, where it opened one
        self.last_input = time.monotonic()  # a controller's last message (the idle timeout)
        # the newest input the next frame shows and when it arrived; (-1, None): none newer
        # than the last frame's
        self.frame_input: tuple[int, float | None] = (-1, None)
        self._input_seq = -1  # the newest steering input applied, and when it arrived
        self._input_ms: float | None = None
        self._shown_seq = -1  # the newest input a frame showed
        self._bucket = TokenBucket(INPUT_RATE_PER_S, INPUT_BURST)
        self._notices = Notices()  # one rate-limit or forbidden notice a second
        self._format_errors_seen = 0
        self.step = FULL  # the bandwidth step the stream is sent at (stream/bandwidth_steps.py)
        self.guard = HandlerGuard(log)  # for every handler the session hangs on aiortc
        self.on_open: Callable[[], None] | None = None
        self.steered_by: Callable[[], str | None] = lambda: None
        self.on_control: Callable[[SceneCommand], dict[str, Any]] | None = None

    @property
    def newest_input_seq(self) -> int:
        """The `seq` of the newest steering input applied (-1: none yet); moves that arrive
        late on the unordered `moves` channel never take it back."""
        return self._input_seq

    def set_role(self, role: str) -> None:
        """Judge input by `role` from now on; a new controller's idle time starts now."""
        if role == "controller" and self.role != "controller":
            self.last_input = time.monotonic()
        self.role = role

    # -- the channel ------------------------------------------------------------------------

    def attach(self, channel: RTCDataChannel) -> None:
        """A data channel the peer opened: the first `input` one is taken, and the first
        `moves` one; others are closed."""
        if channel.label == MOVES_CHANNEL:
            self.moves = attach_moves(channel, self.moves, self.log, self.on_message)
            return
        if refused_channel(channel, self.channel, self.log):
            return
        self.channel = channel
        channel.on("message", self.on_message)
        # the page learns the stream's figures and limits at once
        when_open(channel, self.guard, "datachannel.open", self._opened)

    def _opened(self) -> None:
        self.announce_quality()
        if self.on_open is not None:
            self.on_open()

    def detach(self) -> None:
        """The peer is gone; its channels with it."""
        self.channel = self.moves = None

    def send(self, message: dict[str, Any]) -> None:
        """Send `message` if the channel is open (else it is dropped: nobody listens)."""
        send_json(self.channel, message)

    def announce_quality(self, **extra: Any) -> None:
        """The `quality` message with the figures as they are, plus `extra` fields."""
        self.send({**self.quality_limits.message(self.quality), **extra})

    def sent_format(self) -> tuple[Resolution, float]:
        """The size and frame rate sent: the page's, at the bandwidth step."""
        return self.step.apply(self.quality.resolution, self.quality.fps)

    def set_step(self, step: Step) -> None:
        """Send the page's size and rate at bandwidth step `step` from the next frame on."""
        before = self.sent_format()
        self.step = step
        after = self.sent_format()
        if after != before:
            self.pipeline.request_format(*after)
        if after[1] != before[1]:
            self._on_fps(after[1])

    # -- per frame --------------------------------------------------------------------------

    def camera_for_frame(self, dt: float) -> OrbitCamera:
        """The camera of the frame about to start, `dt` seconds after the last; notes which
        input it is the first to show (`frame_input`)."""
        self.controller.tick(dt)
        if self._input_seq > self._shown_seq:
            self.frame_input = (self._input_seq, self._input_ms)
            self._shown_seq = self._input_seq
        else:
            self.frame_input = (-1, None)
        return self.controller.snapshot()

    def check_format(self) -> None:
        """A size the page asked for could not be built (NVENC out of sessions, a GPU out of
        memory): the stream went on at its old size; say so, with the figures as they are."""
        if self.pipeline.format_errors == self._format_errors_seen:
            return
        self._format_errors_seen = self.pipeline.format_errors
        encoder = self.pipeline.encoder
        self.quality = replace(self.quality, resolution=Resolution(encoder.width, encoder.height))
        self.announce_quality(error="format_failed")

    # -- messages ---------------------------------------------------------------------------

    def on_message(self, message: str | bytes, moves: bool = False) -> None:
        """One message from the page (on its `moves` channel with `moves`); never raises
        (aiortc would end the peer's transport)."""
        try:
            self._on_message(message, moves)
        except Exception:
            self.metrics.input_rejected.labels("internal").inc()
            self.guard.failed("datachannel.message")
            with contextlib.suppress(Exception):  # the channel may be what failed
                self._send_error("internal", "the worker failed on this message")

    def _on_message(self, message: str | bytes, moves: bool) -> None:
        now = time.monotonic()
        if not self._bucket.take(now):
            self.metrics.input_rejected.labels("rate_limited").inc()
            if self._notices.due("rate_limited", now):
                self.log.warning("audit.rate_limited", extra={"channel": "input"})
                self._send_error("rate_limited", f"over {INPUT_RATE_PER_S:g} events/s")
            return
        arrived_ms = now_ms()
        read = read_message(message, self.metrics, self.send)
        if read is None:
            return
        event, seq = read
        if moves and refuse_off_moves(event, self.metrics, self.send):
            return
        controller = self.role == "controller"
        if isinstance(event, PingRequest):
            self.send(pong(event, arrived_ms))
            return
        if isinstance(event, QualityRequest):
            self._set_quality(event)
        elif isinstance(event, KeyframeRequest):
            self.pipeline.keyframes.request()
        elif isinstance(event, SceneCommand):
            if event.name.startswith("control.") and self.on_control is not None:
                reply = self.on_control(event)
            else:
                reply = self.commands.execute(event, self.role)
            self.send(reply)
            if reply["type"] == "error":
                self.metrics.input_rejected.labels(reply["code"]).inc()
                return
        elif not controller:
            self.refuse_steering(now, "a viewer's input does not reach the worker")
            return
        elif (steering := self.steered_by()) is not None:
            self.refuse_steering(now, f"{steering} steers now: hand control back first")
            return
        else:
            self.steer(event, seq, arrived_ms)
            return
        if controller:
            self.last_input = now
        self.metrics.input_events.labels(event_type(event)).inc()

    def steer(self, event: CameraInput, seq: int | None, arrived_ms: float) -> None:
        """Input of the peer that steers (this page, or a viewer handed control) moves the
        camera; it counts as a controller's activity (the idle timeout)."""
        self.controller.apply(event)
        if seq is not None and seq > self._input_seq:
            self._input_seq, self._input_ms = seq, arrived_ms
        self._on_steer()
        self.last_input = time.monotonic()
        self.metrics.input_events.labels(event_type(event)).inc()

    def restart_input_seq(self) -> None:
        """Another page steers from now on: its `seq` counts from its own start."""
        self._input_seq = self._shown_seq = -1
        self._input_ms = None

    def refuse_steering(self, now: float, message: str) -> None:
        """Steering input this page may not send: counted, answered once a second."""
        self.metrics.input_rejected.labels("forbidden").inc()
        if self._notices.due("forbidden", now):
            self._send_error("forbidden", message)

    def limit_codec(self, max_macroblocks: int | None, max_fps: float | None) -> None:
        """The browser's decoder of the codec its offer settled on takes frames of at most
        `max_macroblocks` and `max_fps` (VP8's `max-fs` and `max-fr`; None: no limit): the
        limits tighten (or, for another offer, loosen back to the worker's) and a stream
        beyond them steps down now."""
        base = self._worker_limits
        fps = base.max_fps if max_fps is None else min(base.max_fps, max_fps)
        self.quality_limits = replace(base, max_macroblocks=max_macroblocks, max_fps=fps)
        current = self.quality
        if self.quality_limits.clamp(current, QualityRequest()) != current or current.fps > fps:
            size = current.resolution
            self._set_quality(QualityRequest(size.width, size.height, min(current.fps, fps)))

    def _set_quality(self, request: QualityRequest) -> None:
        """Clamp the request, hand the change to the pipeline and the frame rate, and answer
        with the figures applied."""
        old, new = self.quality, self.quality_limits.clamp(self.quality, request)
        sent_before = self.sent_format()
        self.quality = new
        sent = self.sent_format()
        if sent != sent_before:
            self.pipeline.request_format(*sent)
        if sent[1] != sent_before[1]:
            self._on_fps(sent[1])
        if new.max_kbps != old.max_kbps:
            limit = self.quality_limits.max_kbps
            self.pipeline.request_bitrate_cap(new.max_kbps * 1000 if new.max_kbps < limit else None)
        self.log.info(
            "session.quality",
            extra={"size": str(new.resolution), "fps": new.fps, "max_kbps": new.max_kbps},
        )
        self.announce_quality()

    def _send_error(self, code: str, message: str) -> None:
        self.send({"type": "error", "code": code, "message": message})
