"""One browser's stream: the frame pipeline and camera, and the peer connection that carries it.

The session outlives its peer connection: a browser that reloads (or loses its network for a
moment) sends a fresh offer for the same session and gets a new peer connection onto the same
camera and encoder. A session ends when it is closed, when no peer connects for
`connect_timeout_s` (at the start or after a peer is lost), or after `idle_timeout_s` without
input from a controller.

This module is the peer connection's life: offer and answer, ICE, the deadlines, the close.
`input_channel` has the `input` data channel, `monitor` the session's figures and frame-rate
governor, `viewers` the pages that watch a shared session (each sent the same encoded frames).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from render_server.encode.codecs import choose_codec
from render_server.encode.protocol import EncodedPacket
from render_server.logs import session_logger
from render_server.metrics import Metrics
from render_server.protocol.signaling import IceCandidate, IceServer
from render_server.render.camera import OrbitCamera
from render_server.stream.controls import CameraController
from render_server.stream.input_channel import InputChannel
from render_server.stream.monitor import SessionMonitor
from render_server.stream.path_control import PathControl
from render_server.stream.pipeline import FramePipeline
from render_server.stream.quality import QualityLimits, StreamQuality
from render_server.stream.quiet_peer import QuietPeerPause
from render_server.stream.scene_commands import SceneCommands
from render_server.stream.scene_loading import SceneLoading
from render_server.stream.state import export_state
from render_server.stream.viewers import Viewers
from render_server.transport.delayed_sack import delay_sacks
from render_server.transport.frame_sender import FrameSender
from render_server.transport.guard import guard_data_channels
from render_server.transport.ice_candidates import add_candidate
from render_server.transport.retransmission import count_retransmits, size_history
from render_server.transport.send_path import SendPath
from render_server.transport.timing import watch_sent_packets
from render_server.transport.track import EncodedVideoTrack
from render_server.transport.video_sender import (
    add_video_sender,
    decoder_limits,
    offered_codecs,
)

# awaited with the reason once the session has ended, whatever ended it
SessionEndCallback = Callable[[str], Awaitable[None]]
# a second failure of the frame pipeline this soon after the first ends the session
PIPELINE_FAILURE_WINDOW_S = 10.0
PEER_CLOSE_S = 5.0  # the most a peer connection's close may hold a session's teardown


class SessionNegotiationError(Exception):
    """The offer cannot be answered (no codec in common, no video section, unparseable SDP),
    or an ICE candidate cannot be used."""


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
        codecs: Sequence[str] = ("H264",),
        send_path: str = "paced",
        congestion_record_dir: str | None = None,
        fec: bool = True,
        fec_copies: bool = True,
        max_viewers: int = 8,
        owner_name: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.role = role
        self.log = session_logger(__name__, session_id, role=role)
        self.pipeline = pipeline
        self.metrics = metrics
        self.fps = fps  # the frame rate a new peer's track starts at
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.idle_fps = idle_fps
        self.playout_delay = playout_delay
        self.codecs = tuple(codecs)  # what this session may be sent in, the worker's order
        self.paced = send_path == "paced"  # else aiortc's own sender (the baseline)
        self.fec = fec  # ULPFEC on the paced path where the browser offers it
        self.fec_copies = fec_copies  # each frame's last FEC packet sent twice (fec_path)
        self._ice_servers = [
            RTCIceServer(urls=s.urls, username=s.username, credential=s.credential)
            for s in ice_servers
        ]
        self._on_end = on_end
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"session-{session_id[:8]}")
        self._close_task: asyncio.Future[None] | None = None
        self._started_at = time.monotonic()
        self._failed_at: float | None = None  # the frame pipeline's last failure
        self._failure_close: asyncio.Task[None] | None = None
        self.pc: RTCPeerConnection | None = None
        self.track: EncodedVideoTrack[OrbitCamera] | None = None
        self.peers = 0
        self.scene_loading: SceneLoading | None = None  # uploaded scenes, where the worker has them
        self.nacks = {True: 0, False: 0}  # NACKed packets resent (True) or missing (False)
        self.input = InputChannel(
            role, self.log, metrics, pipeline, controller, commands, quality, quality_limits,
            on_fps=self._fps_asked, on_steer=self._poke,
        )  # fmt: skip
        self.monitor = SessionMonitor(
            session_id, self.log, metrics, pipeline, self.input, quality.fps,
            current_track=lambda: self.track, set_fps=self._set_fps,
            on_second=self._each_second,
        )  # fmt: skip
        self.path_control = PathControl(
            session_id, self.log, metrics, pipeline, self.input, self.nacks, congestion_record_dir
        )
        self.path_control.on_peer_silent = self._on_peer_silent
        self.quiet = QuietPeerPause(self.log, metrics, pipeline.keyframes.request)
        # the pages that watch this one's stream (docs/sharing.md), each sent its frames
        self.viewers = Viewers(
            session_id, metrics, pipeline, self.input, ice_servers=self._ice_servers,
            playout_delay=playout_delay, connect_timeout_s=connect_timeout_s,
            max_viewers=max_viewers, owner_name=owner_name, close_s=PEER_CLOSE_S,
        )  # fmt: skip
        loop = asyncio.get_running_loop()
        # a browser that never offers, or whose ICE never connects, must not hold the slot
        self._timeout_task: asyncio.Task[None] | None = loop.create_task(
            self._peer_deadline(connect_timeout_s, "connect_timeout")
        )
        self._idle_task = loop.create_task(self._idle_watch()) if idle_timeout_s else None
        self.monitor.start()

    def set_role(self, role: str) -> None:
        """The session changed hands (a resume with another token): from now on its input is
        judged by `role`, a viewer's refused."""
        if role == self.role:
            return
        self.log.info("session.role", extra={"was": self.role, "now": role})
        self.role = role
        self.log = session_logger(__name__, self.session_id, role=role)
        self.input.set_role(role)

    @property
    def send_path(self) -> SendPath | None:
        """The current peer's paced send path (None on the stock path, or between peers)."""
        return self.path_control.path

    @property
    def quality(self) -> StreamQuality:
        """The stream's figures as the page was last told them."""
        return self.input.quality

    def export_state(self) -> dict[str, Any]:
        """What another worker needs to go on with this session (stream/state.py): the
        camera, the quality the page asked for, the scene edits; JSON of MAX_STATE_BYTES."""
        commands = self.input.commands
        upload = self.scene_loading.upload if self.scene_loading is not None else None
        return export_state(
            self.input.controller.camera, self.quality, commands.edits, commands.base, upload
        )

    @property
    def connected(self) -> bool:
        """A peer's media is connected now."""
        return self.pc is not None and self.pc.connectionState == "connected"

    @property
    def frames(self) -> int:
        """Frames handed to aiortc, every peer's."""
        return self.monitor.frames

    @property
    def dropped_ticks(self) -> int:
        """Frame times skipped because a frame took too long, every peer's."""
        track = self.track
        return self.monitor.dropped_ticks + (track.dropped_ticks if track is not None else 0)

    # -- negotiation -----------------------------------------------------------------------

    async def accept_offer(self, sdp: str) -> str:
        """Answer an offer; a later offer replaces the peer connection (a reload, a resume)."""
        if self._close_task is not None:
            raise SessionNegotiationError("the session is closing")
        if self.pc is not None:
            await self._drop_peer()
            self.pipeline.keyframes.request()  # the new peer's decoder starts from scratch
        # after the old peer is gone: its track must not pack frames of another codec
        codec = await self._settle_codec(sdp)
        await self.viewers.settle_codec(codec)
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self._ice_servers))
        track = EncodedVideoTrack(
            self.pipeline, self.fps, self.input.camera_for_frame, self._executor,
            self._frame_handed, idle_fps=self.idle_fps, on_error=self._frame_failed,
        )  # fmt: skip
        timing = self.monitor.new_peer()
        self.pc, self.track = pc, track
        self.peers += 1
        # aiortc calls these from its receive path: they never raise into it (transport/guard.py)
        guard = self.input.guard
        pc.on(
            "connectionstatechange",
            guard.coroutine("connectionstatechange", lambda: self._on_connection_state(pc)),
        )
        pc.on("datachannel", guard.sync("datachannel", self.input.attach))
        transceiver = add_video_sender(
            pc, track, self.playout_delay, self.pipeline.keyframes.request,
            self._on_receiver_estimate, codec, transport_cc=self.paced,
            fec=self.paced and self.fec,
        )  # fmt: skip
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError/OperationError/others on bad SDP
            raise SessionNegotiationError(_negotiation_message(exc)) from exc
        if transceiver.mid is None:
            raise SessionNegotiationError("the offer has no video section to receive the stream")
        # after the offer: BUNDLE may have moved the sender onto the data channel's transport
        count_retransmits(transceiver.sender, self._nacked)
        self.quiet.new_peer(transceiver.sender)
        if self.paced:  # frames go whole to the path, and leave past the transport's _send_rtp
            size_history(self.input.quality_limits.max_kbps * 1000)
            path = self.path_control.start(transceiver.sender, self.peers)
            path.on_marker(timing.packet_sent)
            FrameSender(transceiver.sender, path.send_frame).install()
        else:
            watch_sent_packets(transceiver.sender, timing.packet_sent)
        if pc.sctp is not None:  # the offer's data channel: what the page sends on it
            guard_data_channels(pc.sctp, guard)
            delay_sacks(pc.sctp)
        await pc.setLocalDescription(await pc.createAnswer())
        fec = self.path_control.answered(pc.localDescription.sdp, self.fec_copies)
        self.log.info("session.answered", extra={"peer": self.peers, "codec": codec, "fec": fec})
        return pc.localDescription.sdp

    async def _settle_codec(self, sdp: str) -> str:
        """The codec to send this offer's browser: the first it offers that this session may be
        sent in, with the pipeline's encoder switched to it on the session's thread (between
        frames); SessionNegotiationError, naming both sides' codecs, where there is none or its
        encoder does not open."""
        offered = offered_codecs(sdp)
        codec = choose_codec(offered, self.codecs)
        if codec is None:
            if "m=video" not in sdp:
                raise SessionNegotiationError(
                    "the offer has no video section to receive the stream"
                )
            raise SessionNegotiationError(
                f"no codec in common: the browser offers {', '.join(offered) or 'none we know'}"
                f"; this worker sends {', '.join(self.codecs)}"
            )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.pipeline.set_codec, codec)
        except Exception as exc:  # an encoder that does not open: libvpx missing, NVENC full
            self.log.warning("session.codec_failed", extra={"codec": codec, "error": str(exc)})
            raise SessionNegotiationError(f"the {codec} encoder did not open: {exc}") from exc
        self.input.limit_codec(*decoder_limits(sdp, codec))
        return codec

    async def add_ice_candidate(self, message: IceCandidate) -> None:
        if self.pc is None:
            raise SessionNegotiationError("ICE candidate before any offer")
        try:
            await add_candidate(self.pc, message)
        except ValueError as exc:
            raise SessionNegotiationError(str(exc)) from exc

    # -- the stream --------------------------------------------------------------------------

    def _frame_handed(self, packet: EncodedPacket, handed_ms: float) -> None:
        self.input.check_format()
        self.monitor.frame_handed(packet, handed_ms, self.input.frame_input)
        # the same encoded frame to every viewer; none of them is waited for
        self.viewers.frame(packet, self.pipeline.last.keyframe or bool(packet.is_keyframe))

    def _frame_failed(self, exc: Exception) -> bool:
        """A frame raised (an encoder or CUDA error, a scene edit that did not build): the
        first time, the pipeline is built afresh and the stream goes on from a keyframe; a
        second failure within PIPELINE_FAILURE_WINDOW_S ends the session (`worker_failed`,
        which the browser is told) rather than leave it frozen. False: the track ends."""
        now = time.monotonic()
        self.metrics.pipeline_failures.inc()
        if self._failed_at is not None and now - self._failed_at < PIPELINE_FAILURE_WINDOW_S:
            self.log.error("session.pipeline_failed", exc_info=exc,
                           extra={"error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
            if self._failure_close is None:
                self._failure_close = asyncio.get_running_loop().create_task(
                    self.close("worker_failed")
                )
            return False
        self._failed_at = now
        self.log.error("session.frame_failed", exc_info=exc,
                       extra={"error": f"{type(exc).__name__}: {exc}"[:300]})  # fmt: skip
        self.pipeline.request_rebuild()
        return True

    def _nacked(self, resent: bool) -> None:
        """A packet the browser NACKed: resent from the history, or gone from it."""
        self.nacks[resent] += 1
        self.metrics.retransmissions.labels("resent" if resent else "missing").inc()

    def _on_receiver_estimate(self, bitrate: int) -> None:
        """REMB: the browser's estimate of what the path carries; the encoder follows it, or
        on the paced path the congestion controller takes it as a cap."""
        if not self.path_control.on_remb(bitrate):
            self.pipeline.request_bitrate(bitrate)
        self.metrics.remb.inc()

    def _fps_asked(self, fps: float) -> None:
        """The page asked for another frame rate: the governor starts from it again."""
        self.monitor.governor.want(fps)
        self._set_fps(fps)

    def _set_fps(self, fps: float) -> None:
        self.fps = fps
        if self.track is not None:
            self.track.set_fps(fps)

    def _poke(self) -> None:
        if self.track is not None:
            self.track.poke()  # render now rather than at the next tick

    # -- lifecycle --------------------------------------------------------------------------

    async def close(self, reason: str) -> None:
        """Stop the stream and free its resources; the first reason given is the one reported.

        The teardown runs in a task of its own: a caller cancelled midway (a handler whose
        socket went away) must not leave the slot claimed or the peer connection open.
        """
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._teardown(reason))
        await asyncio.shield(self._close_task)

    async def _teardown(self, reason: str) -> None:
        if self.scene_loading is not None:
            self.scene_loading.cancel()
        for task in (self._timeout_task, self._idle_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self.monitor.stop()
        await self.viewers.close(reason)
        await self._drop_peer()
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
                "resent": self.nacks[True],
                "resend_missing": self.nacks[False],
                "seconds": round(time.monotonic() - self._started_at, 1),
            },
        )
        await self._on_end(reason)

    async def _drop_peer(self) -> None:
        pc, track = self.pc, self.track
        self.pc = self.track = None
        await self.path_control.stop()
        self.input.detach()
        if track is not None:
            self.monitor.peer_gone(track)
            track.stop()
        if pc is not None:
            pc.remove_all_listeners()  # its closing is no news to this session
            with contextlib.suppress(Exception):  # TimeoutError included
                # aioice's close waits on a dead TURN server's answers for a minute and more
                async with asyncio.timeout(PEER_CLOSE_S):
                    await pc.close()

    async def _on_connection_state(self, pc: RTCPeerConnection) -> None:
        state = pc.connectionState
        if state == "connected":
            self.quiet.connected()
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
            await self._lose_peer(state)

    async def _lose_peer(self, state: str) -> None:
        """The peer went (its connection `state`): the browser may come back with a new offer
        (a reload), given the same time as a first connection before the slot is given up."""
        await self._drop_peer()
        self.log.info("session.peer_lost", extra={"state": state})
        if self._timeout_task is None:
            self._timeout_task = asyncio.get_running_loop().create_task(
                self._peer_deadline(self.connect_timeout_s, "peer_" + state)
            )

    def _each_second(self) -> None:
        self.path_control.each_second()
        self.quiet.check(self.track, self.path_control.path, bool(self.viewers.peers))

    def _on_peer_silent(self) -> None:
        # no RTCP for seconds: a peer whose path died (its TURN server, say) before ICE says so
        if self.pc is not None and self._close_task is None:
            asyncio.get_running_loop().create_task(self._lose_peer("silent"))

    async def _peer_deadline(self, seconds: float, reason: str) -> None:
        await asyncio.sleep(seconds)
        if self.pc is None or self.pc.connectionState != "connected":
            await self.close(reason)
        self._timeout_task = None

    async def _idle_watch(self) -> None:
        assert self.idle_timeout_s is not None
        while True:
            await asyncio.sleep(min(self.idle_timeout_s, 5.0) / 2)
            idle_s = time.monotonic() - self.input.last_input
            if self.role == "controller" and idle_s > self.idle_timeout_s:
                await self.close("idle")
                return


def _negotiation_message(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if "send parameters" in text:
        return "the offer has no codec this worker sends"
    return f"the offer could not be applied: {text[:200]}"
