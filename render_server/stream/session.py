"""One browser's stream: the frame pipeline and camera, and the peer connection that carries it.

The session outlives its peer connection: a browser that reloads (or loses its network for a
moment) sends a fresh offer for the same session and gets a new peer connection onto the same
camera and encoder. A session ends when it is closed, when no peer connects for
`connect_timeout_s` (at the start or after a peer is lost), or after `idle_timeout_s` without
input from a controller.

The `input` data channel carries input events, stream quality and keyframe requests, and scene
commands (docs/data-channel.md). A viewer may set its own stream's quality, ask for keyframes
and send read-only commands; the camera and the scene are a controller's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import av
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.rtcrtpparameters import RTCRtpCodecCapability
from aiortc.sdp import candidate_from_sdp

from render_server.config import Resolution
from render_server.logs import session_logger
from render_server.metrics import Metrics
from render_server.protocol.data_channel import (
    CommandError,
    InputError,
    KeyframeRequest,
    PingRequest,
    QualityRequest,
    SceneCommand,
    event_type,
    parse_message,
)
from render_server.protocol.rate_limit import TokenBucket
from render_server.protocol.signaling import IceCandidate, IceServer
from render_server.render.camera import OrbitCamera
from render_server.stream.controls import CameraController
from render_server.stream.errors import SessionEndCallback, SessionNegotiationError
from render_server.stream.governor import FrameRateGovernor, SecondOfFrames
from render_server.stream.pipeline import FramePipeline
from render_server.stream.quality import QualityLimits, StreamQuality
from render_server.stream.scene_commands import SceneCommands, error_reply
from render_server.transport.playout_delay import register_playout_delay, request_playout_delay
from render_server.transport.rtcp_feedback import route_rtcp_feedback
from render_server.transport.timing import FrameRecord, FrameTimingLog, now_ms, watch_sent_packets
from render_server.transport.track import EncodedVideoTrack

register_playout_delay()  # negotiated on every peer connection; written where asked for

INPUT_CHANNEL = "input"
INPUT_RATE_PER_S = 500.0  # a 1000 Hz gaming mouse coalesced by the browser stays well below
INPUT_BURST = 200
TIMING_INTERVAL_S = 0.1
TIMING_BATCH = 24  # records per message: well under the data channel's message size


def h264_codec_preferences() -> list[RTCRtpCodecCapability]:
    """H.264 (and its RTX) only: the project's encoder makes H.264, aiortc must not pick VP8."""
    codecs = RTCRtpSender.getCapabilities("video").codecs
    return [c for c in codecs if c.mimeType.lower() in ("video/h264", "video/rtx")]


class StreamSession:
    def __init__(
        self,
        session_id: str,
        pipeline: FramePipeline,
        controller: CameraController,
        fps: float,
        connect_timeout_s: float,
        ice_servers: Sequence[IceServer],
        metrics: Metrics,
        on_end: SessionEndCallback,
        role: str = "controller",
        idle_timeout_s: float | None = None,
        *,
        commands: SceneCommands,
        quality: StreamQuality,
        quality_limits: QualityLimits,
        idle_fps: float | None = None,
        playout_delay: str = "low",
    ) -> None:
        self.session_id = session_id
        self.role = role
        self.log = session_logger(__name__, session_id, role=role)
        self.pipeline = pipeline
        self.controller = controller
        self.metrics = metrics
        self.fps = fps
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.commands = commands
        self.quality = quality
        self.quality_limits = quality_limits
        self.idle_fps = idle_fps
        self.playout_delay = playout_delay
        self.timing = FrameTimingLog()
        # looked up once: every frame observes four of them
        self._stage_histograms = {
            stage: metrics.frame_stage_seconds.labels(stage)
            for stage in ("wait", "render", "encode", "handoff", "send")
        }
        self._format_errors_seen = 0
        self._input_seq = -1  # the newest steering input applied, and when it arrived
        self._input_ms: float | None = None
        self._shown_seq = -1  # the newest input the last frame showed
        self._frame_input: tuple[int, float | None] = (-1, None)
        self._ice_servers = [
            RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
            for s in ice_servers
        ]
        self._on_end = on_end
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"session-{session_id[:8]}")
        self._input_bucket = TokenBucket(INPUT_RATE_PER_S, INPUT_BURST)
        self._rate_noticed_at = 0.0
        self._reported_bitrate = 0
        self._close_task: asyncio.Future[None] | None = None
        self._started_at = time.monotonic()
        self._last_input = time.monotonic()
        self.pc: RTCPeerConnection | None = None
        self.track: EncodedVideoTrack | None = None
        self.input_channel: RTCDataChannel | None = None
        self.frames = 0
        self.dropped_ticks = 0
        self.peers = 0
        loop = asyncio.get_running_loop()
        # a browser that never offers, or whose ICE never connects, must not hold the slot
        self._timeout_task: asyncio.Task[None] | None = loop.create_task(
            self._peer_deadline(connect_timeout_s, "connect_timeout")
        )
        self._idle_task = loop.create_task(self._idle_watch()) if idle_timeout_s else None
        self._timing_task = loop.create_task(self._send_timing())
        self.governor = FrameRateGovernor(quality.fps)
        self._label = session_id[:12]
        self._busy_s = 0.0  # frame production time (start → hand-off), for the governor
        self._send_ms: list[float] = []
        self._govern_task = loop.create_task(self._govern())

    # -- negotiation -----------------------------------------------------------------------

    async def accept_offer(self, sdp: str) -> str:
        """Answer an offer; a later offer replaces the peer connection (a reload, a resume)."""
        if self._close_task is not None:
            raise SessionNegotiationError("the session is closing")
        if self.pc is not None:
            await self._drop_peer()
            self.pipeline.keyframes.request()  # the new peer's decoder starts from scratch
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self._ice_servers))
        track = EncodedVideoTrack(
            self.pipeline, self.fps, self._camera_for_frame, self._executor, self._count_frame,
            idle_fps=self.idle_fps,
        )  # fmt: skip
        self.timing = FrameTimingLog()  # a new sender: a new RTP timestamp origin
        self.pc, self.track, self.input_channel = pc, track, None
        self.peers += 1
        pc.on("connectionstatechange", lambda: self._on_connection_state(pc))
        pc.on("datachannel", self._on_datachannel)
        transceiver = pc.addTransceiver(track, direction="sendonly")
        transceiver.setCodecPreferences(h264_codec_preferences())
        route_rtcp_feedback(
            transceiver.sender, self.pipeline.keyframes.request, self._on_receiver_estimate
        )
        request_playout_delay(transceiver.sender, self.playout_delay)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError/OperationError/others on bad SDP
            raise SessionNegotiationError(_negotiation_message(exc)) from exc
        if transceiver.mid is None:
            raise SessionNegotiationError("the offer has no video section to receive the stream")
        # after the offer: BUNDLE may have moved the sender onto the data channel's transport
        watch_sent_packets(transceiver.sender, self.timing.packet_sent)
        await pc.setLocalDescription(await pc.createAnswer())
        self.log.info("session.answered", extra={"peer": self.peers})
        return pc.localDescription.sdp

    async def add_ice_candidate(self, message: IceCandidate) -> None:
        if self.pc is None:
            raise SessionNegotiationError("ICE candidate before any offer")
        if not message.candidate:
            await self.pc.addIceCandidate(None)  # end of candidates
            return
        text = message.candidate.removeprefix("a=").removeprefix("candidate:")
        try:
            candidate = candidate_from_sdp(text)
            candidate.sdpMid = message.sdp_mid
            candidate.sdpMLineIndex = message.sdp_mline_index
            await self.pc.addIceCandidate(candidate)
        # aiortc asserts on a short candidate line, raises ValueError on an unknown section
        except (AssertionError, ValueError, IndexError) as exc:
            raise SessionNegotiationError(f"unusable ICE candidate: {exc}") from exc

    async def close(self, reason: str) -> None:
        """Stop the stream and free its resources; the first reason given is the one reported.

        The teardown runs in a task of its own: a caller cancelled midway (a handler whose
        socket went away) must not leave the slot claimed or the peer connection open.
        """
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._teardown(reason))
        await asyncio.shield(self._close_task)

    async def _teardown(self, reason: str) -> None:
        for task in (self._timeout_task, self._idle_task, self._timing_task, self._govern_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self._drop_peer()
        self.metrics.encoder_bitrate.dec(self._reported_bitrate)
        self._reported_bitrate = 0
        # the encoder closes on the session thread, after any frame still in flight
        self._executor.submit(self.pipeline.close)
        self._executor.shutdown(wait=False)
        self.log.info(
            "session.closed",
            extra={
                "reason": reason,
                "frames": self.frames,
                "dropped_ticks": self.dropped_ticks,
                "peers": self.peers,
                "seconds": round(time.monotonic() - self._started_at, 1),
            },
        )
        await self._on_end(reason)

    async def _drop_peer(self) -> None:
        pc, track = self.pc, self.track
        self.pc = self.track = self.input_channel = None
        if track is not None:
            self.dropped_ticks += track.dropped_ticks
            track.stop()
        if pc is not None:
            pc.remove_all_listeners()  # its closing is no news to this session
            with contextlib.suppress(Exception):
                await pc.close()

    # -- media and input --------------------------------------------------------------------

    def _camera_for_frame(self, dt: float) -> OrbitCamera:
        self.controller.tick(dt)
        if self._input_seq > self._shown_seq:
            self._frame_input = (self._input_seq, self._input_ms)
            self._shown_seq = self._input_seq
        else:
            self._frame_input = (-1, None)
        return self.controller.snapshot()

    def _count_frame(self, packet: av.Packet, handed_ms: float) -> None:
        if self.pipeline.format_errors != self._format_errors_seen:
            self._format_failed()
        last = self.pipeline.last
        seq, input_ms = self._frame_input
        self.timing.handed(
            FrameRecord(
                pts=int(packet.pts or 0), seq=seq, input_ms=input_ms, start_ms=last.start_ms,
                rendered_ms=last.rendered_ms, encoded_ms=last.encoded_ms, handed_ms=handed_ms,
                bytes=packet.size, keyframe=last.keyframe,
            )
        )  # fmt: skip
        self._busy_s += (handed_ms - last.start_ms) / 1e3
        stages = self._stage_histograms
        stages["render"].observe((last.rendered_ms - last.start_ms) / 1e3)
        stages["encode"].observe((last.encoded_ms - last.rendered_ms) / 1e3)
        stages["handoff"].observe((handed_ms - last.encoded_ms) / 1e3)
        if input_ms is not None:
            stages["wait"].observe((last.start_ms - input_ms) / 1e3)
        self.frames += 1
        self.metrics.frames.inc()
        self.metrics.frame_bytes.inc(packet.size)
        if last.bitrate != self._reported_bitrate:
            self.metrics.encoder_bitrate.inc(last.bitrate - self._reported_bitrate)
            self._reported_bitrate = last.bitrate
        if last.keyframe:
            self.metrics.keyframes.labels("start" if self.frames == 1 else "request").inc()

    def _on_receiver_estimate(self, bitrate: int) -> None:
        """REMB: the browser's estimate of what the path carries; the encoder follows it."""
        self.pipeline.request_bitrate(bitrate)
        self.metrics.remb.inc()

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != INPUT_CHANNEL or self.input_channel is not None:
            self.log.warning("datachannel.refused", extra={"label": channel.label[:64]})
            channel.close()
            return
        self.input_channel = channel
        channel.on("message", self._on_input)
        # the page learns the stream's figures and limits at once (a remote channel is open
        # when aiortc announces it)
        if channel.readyState == "open":
            self._send(self.quality_limits.message(self.quality))
        else:
            channel.once("open", lambda: self._send(self.quality_limits.message(self.quality)))

    def _on_input(self, message: str | bytes) -> None:
        now = time.monotonic()
        if not self._input_bucket.take(now):
            self.metrics.input_rejected.labels("rate_limited").inc()
            if now - self._rate_noticed_at > 1.0:  # one notice a second, not one per event
                self._rate_noticed_at = now
                self.log.warning("audit.rate_limited", extra={"channel": "input"})
                self._send_input_error("rate_limited", f"over {INPUT_RATE_PER_S:g} events/s")
            return
        arrived_ms = now_ms()
        try:
            event, seq = parse_message(message)
        except CommandError as exc:
            self.metrics.input_rejected.labels(exc.code).inc()
            self._send(error_reply(exc, exc.id))
            return
        except InputError as exc:
            self.metrics.input_rejected.labels(exc.code).inc()
            self._send_input_error(exc.code, exc.message)
            return
        controller = self.role == "controller"
        if isinstance(event, PingRequest):
            self._send({"type": "pong", "id": event.id, "t": event.t, "w": round(arrived_ms, 3)})
            return
        if isinstance(event, QualityRequest):
            self._set_quality(event)
        elif isinstance(event, KeyframeRequest):
            self.pipeline.keyframes.request()
        elif isinstance(event, SceneCommand):
            reply = self.commands.execute(event, self.role)
            self._send(reply)
            if reply["type"] == "error":
                self.metrics.input_rejected.labels(reply["code"]).inc()
                return
        elif not controller:
            self.metrics.input_rejected.labels("forbidden").inc()
            self._send_input_error("forbidden", "a viewer's input does not reach the worker")
            return
        else:
            self.controller.apply(event)
            if seq is not None and seq > self._input_seq:
                self._input_seq, self._input_ms = seq, arrived_ms
            if self.track is not None:
                self.track.poke()  # render now rather than at the next tick
        if controller:
            self._last_input = now
        self.metrics.input_events.labels(event_type(event)).inc()

    def _format_failed(self) -> None:
        """A size the page asked for could not be built (NVENC out of sessions, a GPU out of
        memory): the stream went on at its old size; say so, with the figures as they are."""
        self._format_errors_seen = self.pipeline.format_errors
        encoder = self.pipeline.encoder
        self.quality = replace(self.quality, resolution=Resolution(encoder.width, encoder.height))
        message = self.quality_limits.message(self.quality)
        self._send({**message, "error": "format_failed"})

    def _set_quality(self, request: QualityRequest) -> None:
        """Clamp the request, hand the change to the pipeline and the track, and answer with
        the figures applied."""
        old, new = self.quality, self.quality_limits.clamp(self.quality, request)
        self.quality = new
        if (new.resolution, new.fps) != (old.resolution, old.fps):
            self.pipeline.request_format(new.resolution, new.fps)
        if new.fps != old.fps:
            self.fps = new.fps
            self.governor.want(new.fps)
            if self.track is not None:
                self.track.set_fps(new.fps)
        if new.max_kbps != old.max_kbps:
            limit = self.quality_limits.max_kbps
            self.pipeline.request_bitrate_cap(new.max_kbps * 1000 if new.max_kbps < limit else None)
        self.log.info(
            "session.quality",
            extra={"size": str(new.resolution), "fps": new.fps, "max_kbps": new.max_kbps},
        )
        self._send(self.quality_limits.message(new))

    def _send_input_error(self, code: str, message: str) -> None:
        self._send({"type": "error", "code": code, "message": message})

    def _send(self, message: dict[str, object]) -> None:
        channel = self.input_channel
        if channel is not None and channel.readyState == "open":
            channel.send(json.dumps(message))

    # -- lifecycle --------------------------------------------------------------------------

    async def _on_connection_state(self, pc: RTCPeerConnection) -> None:
        state = pc.connectionState
        if state == "connected":
            if self._timeout_task is not None:
                self._timeout_task.cancel()
                self._timeout_task = None
            self.log.info(
                "session.connected",
                extra={
                    "ms": round((time.monotonic() - self._started_at) * 1e3),
                    "peer": self.peers,
                },
            )
        elif state in ("failed", "closed") and pc is self.pc:
            # the browser may come back with a new offer (a reload): give it the same time as
            # a first connection before the slot is given up
            await self._drop_peer()
            self.log.info("session.peer_lost", extra={"state": state})
            if self._timeout_task is None:
                self._timeout_task = asyncio.get_running_loop().create_task(
                    self._peer_deadline(self.connect_timeout_s, "peer_" + state)
                )

    async def _peer_deadline(self, seconds: float, reason: str) -> None:
        await asyncio.sleep(seconds)
        if self.pc is None or self.pc.connectionState != "connected":
            await self.close(reason)
        self._timeout_task = None

    async def _send_timing(self) -> None:
        """The frames' timing records, batched: one small message every TIMING_INTERVAL_S."""
        while True:
            await asyncio.sleep(TIMING_INTERVAL_S)
            records = self.timing.drain()
            if not records:
                continue
            send = self._stage_histograms["send"]
            for record in records:
                assert record.sent_ms is not None
                send.observe((record.sent_ms - record.handed_ms) / 1e3)
                self._send_ms.append(record.sent_ms - record.handed_ms)
            for start in range(0, len(records), TIMING_BATCH):
                batch = records[start : start + TIMING_BATCH]
                self._send({"type": "timing", "frames": [r.row() for r in batch]})

    async def _govern(self) -> None:
        """Once a second: per-session figures to /metrics, and fewer frames when overloaded."""
        m, label = self.metrics, self._label
        seen = (0, 0, 0.0, 0)  # ticks, dropped, busy, frames of the current track
        track_seen: EncodedVideoTrack | None = None
        try:
            while True:
                await asyncio.sleep(1.0)
                track = self.track
                cpu = self.pipeline.cpu_seconds()
                if cpu is not None:
                    m.session_cpu.labels(label).set(cpu)
                sends, self._send_ms = self._send_ms, []
                m.session_send_ms.labels(label).set(sum(sends) / len(sends) if sends else 0.0)
                if track is None:
                    continue
                if track is not track_seen:
                    track_seen, seen = track, (0, 0, self._busy_s, self.frames)
                now = (track.ticks, track.dropped_ticks, self._busy_s, self.frames)
                second = SecondOfFrames(
                    ticks=now[0] - seen[0] + now[1] - seen[1], dropped=now[1] - seen[1],
                    busy_s=now[2] - seen[2], frames=now[3] - seen[3],
                )  # fmt: skip
                seen = now
                m.session_dropped.labels(label).set(self.dropped_ticks + track.dropped_ticks)
                fps = self.governor.observe(second)
                if fps is not None:
                    self._apply_governed_fps(fps)
                m.session_fps.labels(label).set(self.governor.fps)
        finally:
            for gauge in (m.session_cpu, m.session_fps, m.session_send_ms, m.session_dropped):
                with contextlib.suppress(KeyError):
                    gauge.remove(label)

    def _apply_governed_fps(self, fps: float) -> None:
        lowered = fps < self.fps
        self.fps = fps
        if self.track is not None:
            self.track.set_fps(fps)
        if lowered:
            self.metrics.overload_steps.inc()
        self.log.warning(
            "session.overload" if lowered else "session.recovered",
            extra={"fps": fps, "wanted_fps": self.governor.wanted_fps},
        )
        message = self.quality_limits.message(self.quality)
        self._send({**message, "fps": fps, "overloaded": fps < self.governor.wanted_fps})

    async def _idle_watch(self) -> None:
        assert self.idle_timeout_s is not None
        while True:
            await asyncio.sleep(min(self.idle_timeout_s, 5.0) / 2)
            if (
                self.role == "controller"
                and time.monotonic() - self._last_input > self.idle_timeout_s
            ):
                await self.close("idle")
                return


def _negotiation_message(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "send parameters" in text:
        return "the offer has no H.264 (packetization-mode 1, constrained baseline) to send"
    return f"the offer could not be applied: {text[:200]}"
