"""A shared session's viewers (docs/sharing.md): one encode, many peer connections.

Each viewer has its own peer connection on aiortc's stock send path, and a `FanOutTrack` that
hands its sender the packets the owner's pipeline encoded: the same objects, never encoded
again. The session hands each frame to every viewer without waiting (`frame`); a viewer that
does not keep up loses frames, its own only (transport/fan_out.py). A viewer's RTCP feedback
never reaches the shared encoder's bitrate (the stream's rate is the owner's congestion
control's); its keyframe requests do, rate-limited per viewer.

Who steers: the owner at first; `control.hand` (the steering peer, or the owner at any time)
and `control.take` (the owner) move it; `control.remove` (the owner) lets one viewer go
(`removed`). Every page hears `presence` when its channel opens and whenever a viewer joins or
leaves, or control changes hands.

A viewer is let go (`viewer.ended`, `peer_lost`) when it does not connect within the stream's
connect timeout, its connection fails or closes, or it sends no RTCP for `silence_s`; when the
session ends, each one with `session_ended` (`moved` where the session moves).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Final

from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

from render_server.encode.protocol import EncodedPacket
from render_server.logs import session_logger
from render_server.metrics import Metrics
from render_server.protocol.data_channel import CameraInput, CommandError, SceneCommand
from render_server.protocol.signaling import IceCandidate
from render_server.protocol.viewers import (
    MOVED,
    OWNER_PEER,
    PEER_LOST,
    REMOVED,
    SESSION_ENDED,
    SHARING_OFF,
    TOO_MANY_VIEWERS,
    ViewerAnswer,
    ViewerEnded,
)
from render_server.stream.input_channel import InputChannel
from render_server.stream.path_control import PEER_SILENT_S
from render_server.stream.pipeline import FramePipeline
from render_server.stream.scene_commands import SceneCommands, error_reply
from render_server.stream.viewer_channel import ViewerChannel
from render_server.transport.delayed_sack import delay_sacks
from render_server.transport.fan_out import FanOutTrack, watch_rtcp
from render_server.transport.guard import HandlerGuard, guard_data_channels
from render_server.transport.ice_candidates import add_candidate
from render_server.transport.video_sender import add_video_sender, offered_codecs

DEFAULT_OWNER_NAME: Final = "host"  # an anonymous owner's name in `presence`
BAD_OFFER: Final = "bad_offer"
CONTROL_COMMANDS: Final = ("control.hand", "control.take", "control.remove")

Notify = Callable[[ViewerEnded], Awaitable[None]]


class ViewerPeer:
    """One viewer: its peer connection, track and channel."""

    def __init__(self, viewer_id: str, name: str, pc: RTCPeerConnection, codec: str) -> None:
        self.id = viewer_id
        self.name = name
        self.pc = pc
        self.codec = codec
        self.track: FanOutTrack | None = None
        self.channel: ViewerChannel | None = None
        self.joined = False  # its media connected: in `presence` and `worker_viewers`
        self.heard_at = time.monotonic()  # its last RTCP (or its connection's start)
        self.deadline: asyncio.Task[None] | None = None


class Viewers:
    """The viewers of one session. `on_ended` (the worker service's) carries `viewer.ended`
    to signaling; `silence_s` is how long a viewer may send no RTCP."""

    def __init__(
        self,
        session_id: str,
        metrics: Metrics,
        pipeline: FramePipeline,
        owner: InputChannel,
        *,
        ice_servers: Sequence[RTCIceServer],
        playout_delay: str,
        connect_timeout_s: float,
        max_viewers: int,
        owner_name: str | None,
        close_s: float,
    ) -> None:
        self.session_id = session_id
        self.log = session_logger(__name__, session_id, role="viewer")
        self.metrics = metrics
        self.pipeline = pipeline
        self.owner = owner
        self.commands: SceneCommands = owner.commands
        self.ice_servers = list(ice_servers)
        self.playout_delay = playout_delay
        self.connect_timeout_s = connect_timeout_s
        self.max_viewers = max_viewers
        self.owner_name = owner_name or DEFAULT_OWNER_NAME
        self.close_s = close_s
        self.silence_s = PEER_SILENT_S
        self.on_ended: Notify | None = None
        self.peers: dict[str, ViewerPeer] = {}  # answered, connected or not
        self.steering = OWNER_PEER
        self.guard = HandlerGuard(self.log)
        self._closed = False
        self._watch: asyncio.Task[None] | None = None
        self._removals: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references
        self._frames = {True: metrics.viewer_frames.labels("sent"),
                        False: metrics.viewer_frames.labels("dropped")}  # fmt: skip
        owner.on_open = lambda: owner.send(self.presence(OWNER_PEER))
        owner.steered_by = self._steers_instead_of_owner
        owner.on_control = partial(self.control, OWNER_PEER)

    # -- the stream ----------------------------------------------------------------------------

    def frame(self, packet: EncodedPacket, keyframe: bool) -> None:
        """The owner's pipeline encoded `packet`: to every viewer, never waiting for one."""
        for peer in self.peers.values():
            if peer.track is not None:
                peer.track.push(packet, keyframe)

    # -- joining and leaving -------------------------------------------------------------------

    async def offer(self, viewer_id: str, name: str, sdp: str) -> ViewerAnswer | ViewerEnded:
        """Answer a viewer's offer, or say why not (`viewer.ended`'s code)."""
        old = self.peers.pop(viewer_id, None)
        if old is not None:  # its page offers again: the new connection replaces the old
            await self._let_go(old)
        codec = self.pipeline.codec
        offered = offered_codecs(sdp)
        if self._closed:
            return self._refused(viewer_id, SESSION_ENDED, "the session is ending")
        if self.max_viewers == 0:
            return self._refused(viewer_id, SHARING_OFF, "this worker does not share sessions")
        if len(self.peers) >= self.max_viewers:
            return self._refused(
                viewer_id, TOO_MANY_VIEWERS, f"the session has {self.max_viewers} viewers already"
            )
        if codec not in offered:
            return self._refused(
                viewer_id, BAD_OFFER, f"the session streams {codec}; the browser offers "
                f"{', '.join(offered) or 'no codec this worker sends'}",
            )  # fmt: skip
        pc = RTCPeerConnection(RTCConfiguration(iceServers=self.ice_servers))
        peer = ViewerPeer(viewer_id, name, pc, codec)
        self.peers[viewer_id] = peer
        try:
            answer = await self._answer(peer, sdp, codec)
        except Exception as exc:  # aiortc raises what a malformed offer makes it raise
            self.peers.pop(viewer_id, None)
            await self._let_go(peer)
            return self._refused(viewer_id, BAD_OFFER, f"the offer could not be applied: {exc}")
        if self.peers.get(viewer_id) is not peer:  # the session ended meanwhile: it was told
            return ViewerEnded(self.session_id, viewer_id, SESSION_ENDED, "the session ended")
        self.metrics.viewer_joins.labels("answered").inc()
        peer.deadline = asyncio.get_running_loop().create_task(self._connect_deadline(peer))
        if self._watch is None:
            self._watch = asyncio.get_running_loop().create_task(self._watch_silence())
        self.log.info("viewer.answered", extra={"viewer": viewer_id, "codec": codec})
        return ViewerAnswer(self.session_id, viewer_id, answer)

    async def _answer(self, peer: ViewerPeer, sdp: str, codec: str) -> str:
        pc = peer.pc
        track = FanOutTrack(self.pipeline.keyframes.request, self._frames_counted)
        peer.track = track
        peer.channel = ViewerChannel(
            self.log, self.metrics, self.guard, self.commands, track.ask_keyframe,
            partial(self._steer, peer.id), partial(self.control, peer.id),
            lambda: self._tell(peer),
        )  # fmt: skip
        pc.on("datachannel", self.guard.sync("viewer.datachannel", peer.channel.attach))
        pc.on(
            "connectionstatechange",
            self.guard.coroutine("viewer.connectionstatechange", lambda: self._state(peer)),
        )
        # the stock path: no transport-cc, no FEC; REMB is ignored (the encoder's rate is the
        # owner's), a PLI asks for a keyframe at most once a second
        transceiver = add_video_sender(
            pc, track, self.playout_delay, track.ask_keyframe, _ignore_estimate, codec
        )
        await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        if transceiver.mid is None:
            raise ValueError("the offer has no video section to receive the stream")
        watch_rtcp(transceiver.sender, partial(self._heard, peer))
        if pc.sctp is not None:
            guard_data_channels(pc.sctp, self.guard)
            delay_sacks(pc.sctp)
        await pc.setLocalDescription(await pc.createAnswer())
        return str(pc.localDescription.sdp)

    async def add_ice(self, viewer_id: str, message: IceCandidate) -> None:
        """A viewer's candidate; one of a viewer gone, or one that does not parse, is dropped."""
        peer = self.peers.get(viewer_id)
        if peer is None:
            return
        try:
            await add_candidate(peer.pc, message)
        except ValueError as exc:
            self.log.warning("viewer.bad_candidate", extra={"viewer": viewer_id, "error": str(exc)})

    async def leave(self, viewer_id: str, reason: str) -> None:
        """The viewer's page left (nothing to tell it)."""
        peer = self.peers.pop(viewer_id, None)
        if peer is not None:
            self.log.info("viewer.left", extra={"viewer": viewer_id, "reason": reason})
            await self._let_go(peer)

    async def end(self, viewer_id: str, code: str, message: str) -> None:
        """Let the viewer go and tell it why (`viewer.ended`)."""
        peer = self.peers.pop(viewer_id, None)
        if peer is not None:
            await self._ended(peer, code, message)

    async def _ended(self, peer: ViewerPeer, code: str, message: str) -> None:
        self.log.info("viewer.ended", extra={"viewer": peer.id, "code": code})
        await self._let_go(peer)
        await self._notify(ViewerEnded(self.session_id, peer.id, code, message))

    async def settle_codec(self, codec: str) -> None:
        """The owner's new peer takes another codec: the viewers sent the old one watch again
        (their page offers anew, and is answered in the new codec or refused)."""
        moved = [p.id for p in self.peers.values() if p.codec != codec]
        text = f"the session streams {codec} from now on: watch again"
        await asyncio.gather(*(self.end(vid, PEER_LOST, text) for vid in moved))

    async def end_all(self, code: str, message: str) -> None:
        """Every viewer's stream ends (the owner stopped sharing); new ones may come later."""
        await asyncio.gather(*(self.end(vid, code, message) for vid in list(self.peers)))

    async def close(self, reason: str) -> None:
        """The session ends: every viewer with it."""
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
        code = MOVED if reason == MOVED else SESSION_ENDED
        text = "the session moves to another worker" if code == MOVED else "the session ended"
        await asyncio.gather(*(self.end(vid, code, text) for vid in list(self.peers)))

    def _refused(self, viewer_id: str, code: str, message: str) -> ViewerEnded:
        self.metrics.viewer_joins.labels(code).inc()
        self.log.info("viewer.refused", extra={"viewer": viewer_id, "code": code})
        return ViewerEnded(self.session_id, viewer_id, code, message)

    async def _let_go(self, peer: ViewerPeer) -> None:
        """Close its connection (bounded: a dead TURN server holds aioice's close a minute)."""
        if peer.deadline is not None and peer.deadline is not asyncio.current_task():
            peer.deadline.cancel()
        if peer.track is not None:
            peer.track.stop()
        if peer.joined:
            peer.joined = False
            self.metrics.viewers_connected.dec()
            if self.steering == peer.id:  # control goes back to the owner
                self._set_steering(OWNER_PEER)
            self.announce()
        pc = peer.pc
        pc.remove_all_listeners()
        with contextlib.suppress(Exception):  # TimeoutError included
            async with asyncio.timeout(self.close_s):
                await pc.close()

    async def _notify(self, message: ViewerEnded) -> None:
        if self.on_ended is not None:
            try:
                await self.on_ended(message)
            except Exception:  # signaling is gone: the viewer's page hears it from there
                self.log.warning("viewer.notify_failed", exc_info=True)

    # -- the peers' health ---------------------------------------------------------------------

    async def _state(self, peer: ViewerPeer) -> None:
        state = peer.pc.connectionState
        if state == "connected" and not peer.joined and self.peers.get(peer.id) is peer:
            peer.joined = True
            peer.heard_at = time.monotonic()
            if peer.deadline is not None:
                peer.deadline.cancel()
            self.metrics.viewers_connected.inc()
            self.log.info("viewer.connected", extra={"viewer": peer.id})
            self.announce()
        elif state in ("failed", "closed"):
            await self.end(peer.id, PEER_LOST, f"its connection {state}")

    def _heard(self, peer: ViewerPeer) -> None:
        peer.heard_at = time.monotonic()

    async def _connect_deadline(self, peer: ViewerPeer) -> None:
        await asyncio.sleep(self.connect_timeout_s)
        if not peer.joined:
            await self.end(peer.id, PEER_LOST, "it never connected")

    async def _watch_silence(self) -> None:
        """Viewers whose RTCP stopped: their path died before ICE says so (it takes 30 s)."""
        while True:
            await asyncio.sleep(min(self.silence_s / 4, 1.0))
            now = time.monotonic()
            silent = [p.id for p in self.peers.values()
                      if p.joined and now - p.heard_at > self.silence_s]  # fmt: skip
            for viewer_id in silent:
                gone = f"no RTCP for {self.silence_s:g} s"
                await self.end(viewer_id, PEER_LOST, gone)

    def _frames_counted(self, sent: bool) -> None:
        self._frames[sent].inc()

    # -- steering and presence -----------------------------------------------------------------

    def _steer(
        self, viewer_id: str, event: CameraInput, seq: int | None, arrived_ms: float
    ) -> str | None:
        """A viewer's steering input: applied where it steers; else the name of who does."""
        if self.steering != viewer_id:
            return self._name(self.steering)
        self.owner.steer(event, seq, arrived_ms)
        return None

    def control(self, peer_id: str, command: SceneCommand) -> dict[str, Any]:
        """`control.hand {to}` (the steering peer, or the owner) and `control.take {}` (the
        owner): the `result` or `error` that answers it."""
        try:
            value = self._control(peer_id, command)
        except CommandError as exc:
            return error_reply(exc, command.id)
        return {"type": "result", "id": command.id, "name": command.name, "value": value}

    def _control(self, peer_id: str, command: SceneCommand) -> dict[str, Any]:
        owner = peer_id == OWNER_PEER
        if command.name not in CONTROL_COMMANDS:
            raise CommandError(
                "unknown_command",
                f"unknown command {command.name!r}; control commands: "
                f"{', '.join(CONTROL_COMMANDS)}",
                command.id,
            )  # fmt: skip
        if owner and self.owner.role != "controller":
            raise CommandError("forbidden", "this page only watches", command.id)
        args = command.args
        if command.name == "control.take":
            if args:
                raise CommandError("bad_command", "`control.take` takes no arguments", command.id)
            if not owner:
                raise CommandError("forbidden", "only the owner takes control", command.id)
            self._set_steering(OWNER_PEER)
            return {"steering": OWNER_PEER}
        if command.name == "control.remove":
            return self._remove(owner, command)
        to = args.get("to")
        if set(args) != {"to"} or not isinstance(to, str):
            raise CommandError("bad_command", "`control.hand` takes `to`: a peer id", command.id)
        if not owner and self.steering != peer_id:
            raise CommandError(
                "forbidden", f"{self._name(self.steering)} steers: only they or the owner hand "
                "control", command.id,
            )  # fmt: skip
        target = self.peers.get(to)
        if to != OWNER_PEER and (target is None or not target.joined):
            raise CommandError("bad_command", f"no peer {to[:40]!r} watches", command.id)
        self._set_steering(to)
        return {"steering": to}

    def _remove(self, owner: bool, command: SceneCommand) -> dict[str, Any]:
        """`control.remove {peer}` (the owner): that viewer's stream ends (`removed`, final:
        its page does not watch again by itself); steering it held goes back to the owner."""
        peer_id = command.args.get("peer")
        if set(command.args) != {"peer"} or not isinstance(peer_id, str):
            raise CommandError(
                "bad_command", "`control.remove` takes `peer`: a viewer's id", command.id
            )
        if not owner:
            raise CommandError("forbidden", "only the owner removes a viewer", command.id)
        peer = self.peers.pop(peer_id, None)
        if peer is None:
            raise CommandError("bad_command", f"no viewer {peer_id[:40]!r} watches", command.id)
        self.metrics.viewers_removed.inc()
        # closing its connection may take a while: the owner is answered now
        removal = asyncio.get_running_loop().create_task(
            self._ended(peer, REMOVED, f"{self.owner_name} removed you from this session")
        )
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)
        return {"removed": peer_id}

    def _set_steering(self, peer_id: str) -> None:
        if peer_id == self.steering:
            return
        self.log.info("viewer.control", extra={"was": self.steering, "now": peer_id})
        self.steering = peer_id
        self.owner.restart_input_seq()  # the new page's input counter starts from its own 0
        self.announce()

    def _steers_instead_of_owner(self) -> str | None:
        return None if self.steering == OWNER_PEER else self._name(self.steering)

    def _name(self, peer_id: str) -> str:
        if peer_id == OWNER_PEER:
            return self.owner_name
        peer = self.peers.get(peer_id)
        return peer.name if peer is not None else peer_id

    def presence(self, you: str) -> dict[str, Any]:
        """The `presence` message for the page of peer `you`."""
        peers = [{"id": OWNER_PEER, "name": self.owner_name, "role": "owner"}]
        peers += [
            {"id": p.id, "name": p.name, "role": "viewer"} for p in self.peers.values() if p.joined
        ]
        return {"type": "presence", "you": you, "steering": self.steering,
                "maxViewers": self.max_viewers, "peers": peers}  # fmt: skip

    def announce(self) -> None:
        """`presence` to every page whose channel is open."""
        self.owner.send(self.presence(OWNER_PEER))
        for peer in self.peers.values():
            if peer.joined:
                self._tell(peer)

    def _tell(self, peer: ViewerPeer) -> None:
        if peer.channel is not None:
            peer.channel.send(self.presence(peer.id))


def _ignore_estimate(bitrate: int) -> None:
    """A viewer's REMB: the shared encoder's rate is the owner's congestion control's."""
