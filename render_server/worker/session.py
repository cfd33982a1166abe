"""One browser's stream: a peer connection, the encoded video track and the input channel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

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

from ..logs import session_logger
from ..metrics import Metrics
from ..rate_limit import TokenBucket
from ..signaling.messages import IceCandidate
from ..signaling.workers import SessionEndCallback, SessionNegotiationError
from .controls import CameraController
from .input_events import InputError, parse_input
from .pipeline import FramePipeline
from .rtcp_feedback import route_rtcp_feedback
from .track import EncodedVideoTrack

INPUT_CHANNEL = "input"
INPUT_RATE_PER_S = 500.0  # a 1000 Hz gaming mouse coalesced by the browser stays well below
INPUT_BURST = 200


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
        ice_servers: tuple[str, ...],
        metrics: Metrics,
        on_end: SessionEndCallback,
    ) -> None:
        self.session_id = session_id
        self.log = session_logger(__name__, session_id)
        self.pipeline = pipeline
        self.controller = controller
        self.metrics = metrics
        self._on_end = on_end
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"session-{session_id[:8]}")
        self.track = EncodedVideoTrack(
            pipeline, fps, self._camera_for_frame, self._executor, on_frame=self._count_frame
        )
        self.pc = RTCPeerConnection(
            RTCConfiguration(iceServers=[RTCIceServer(urls=u) for u in ice_servers])
        )
        self.pc.on("connectionstatechange", self._on_connection_state)
        self.pc.on("datachannel", self._on_datachannel)
        self._input_bucket = TokenBucket(INPUT_RATE_PER_S, INPUT_BURST)
        self._rate_noticed_at = 0.0
        self._reported_bitrate = 0
        self._close_task: asyncio.Future[None] | None = None
        self._started_at = time.monotonic()
        # a browser that never offers, or whose ICE never connects, must not hold the slot
        self._timeout_task = asyncio.get_running_loop().create_task(
            self._connect_timeout(connect_timeout_s)
        )
        self.input_channel: RTCDataChannel | None = None

    # -- negotiation -----------------------------------------------------------------------

    async def accept_offer(self, sdp: str) -> str:
        transceiver = self.pc.addTransceiver(self.track, direction="sendonly")
        transceiver.setCodecPreferences(h264_codec_preferences())
        route_rtcp_feedback(
            transceiver.sender, self.pipeline.keyframes.request, self._on_receiver_estimate
        )
        try:
            await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError/OperationError/others on bad SDP
            raise SessionNegotiationError(_negotiation_message(exc)) from exc
        if transceiver.mid is None:
            raise SessionNegotiationError("the offer has no video section to receive the stream")
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        self.log.info("session.answered")
        return self.pc.localDescription.sdp

    async def add_ice_candidate(self, message: IceCandidate) -> None:
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
        self._timeout_task.cancel()
        self.track.stop()
        with contextlib.suppress(Exception):
            await self.pc.close()
        self.metrics.encoder_bitrate.dec(self._reported_bitrate)
        self._reported_bitrate = 0
        # the encoder closes on the session thread, after any frame still in flight
        self._executor.submit(self.pipeline.close)
        self._executor.shutdown(wait=False)
        self.log.info(
            "session.closed",
            extra={
                "reason": reason,
                "frames": self.track.frames,
                "dropped_ticks": self.track.dropped_ticks,
                "seconds": round(time.monotonic() - self._started_at, 1),
            },
        )
        await self._on_end(reason)

    # -- media and input --------------------------------------------------------------------

    def _camera_for_frame(self, dt: float):  # type: ignore[no-untyped-def]
        self.controller.tick(dt)
        return self.controller.snapshot()

    def _count_frame(self, packet: av.Packet) -> None:
        self.metrics.frames.inc()
        self.metrics.frame_bytes.inc(packet.size)
        bitrate = self.pipeline.last.bitrate
        if bitrate != self._reported_bitrate:
            self.metrics.encoder_bitrate.inc(bitrate - self._reported_bitrate)
            self._reported_bitrate = bitrate
        if self.pipeline.last.keyframe:
            reason = "start" if self.track.frames == 1 else "request"
            self.metrics.keyframes.labels(reason).inc()

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

    def _on_input(self, message: str | bytes) -> None:
        if not self._input_bucket.take(time.monotonic()):
            self.metrics.input_rejected.labels("rate_limited").inc()
            now = time.monotonic()
            if now - self._rate_noticed_at > 1.0:  # one notice a second, not one per event
                self._rate_noticed_at = now
                self._send_input_error("rate_limited", f"over {INPUT_RATE_PER_S:g} events/s")
            return
        try:
            event = parse_input(message)
        except InputError as exc:
            self.metrics.input_rejected.labels(exc.code).inc()
            self._send_input_error(exc.code, exc.message)
            return
        self.controller.apply(event)
        self.metrics.input_events.labels(type(event).__name__.removesuffix("Event").lower()).inc()

    def _send_input_error(self, code: str, message: str) -> None:
        channel = self.input_channel
        if channel is not None and channel.readyState == "open":
            channel.send(json.dumps({"type": "error", "code": code, "message": message}))

    # -- lifecycle --------------------------------------------------------------------------

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.log.info(
                "session.connected",
                extra={"ms": round((time.monotonic() - self._started_at) * 1e3)},
            )
        elif state in ("failed", "closed"):
            await self.close("peer_" + state)

    async def _connect_timeout(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self.pc.connectionState != "connected":
            await self.close("connect_timeout")


def _negotiation_message(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "send parameters" in text:
        return "the offer has no H.264 (packetization-mode 1, constrained baseline) to send"
    return f"the offer could not be applied: {text[:200]}"
