"""A live session shared with viewers (docs/sharing.md), on the worker: real aiortc peers on
loopback for the owner and its viewers, through the worker service as signaling drives it.

Each frame is encoded once and the same packet goes to every peer; a viewer watches and may
not steer until handed control; a viewer that stops reading loses its own frames only and is
let go; the session's end ends every viewer."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import av
import pytest
from aiortc import RTCPeerConnection, RTCRtpReceiver, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from prometheus_client.parser import text_string_to_metric_families

from render_server.config import ConfigError, Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.protocol.viewers import (
    MOVED,
    OWNER_PEER,
    PEER_LOST,
    REMOVED,
    REVOKED,
    SESSION_ENDED,
    SHARING_OFF,
    TOO_MANY_VIEWERS,
    ViewerAnswer,
    ViewerEnded,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewerRequest,
    ViewersEnd,
)
from render_server.protocol.worker import (
    CloseSession,
    OpenSession,
    SessionOffer,
    ToSignaling,
    WorkerAnswer,
    WorkerSessionEnded,
)
from render_server.render.scene import Scene
from render_server.stream.quiet_peer import PEER_QUIET_S
from render_server.stream.session import StreamSession
from render_server.transport.fan_out import FanOutTrack
from render_server.worker.local import LocalWorker
from render_server.worker.pool import PoolService
from render_server.worker.pool_children import Child, WorkerPool
from render_server.worker.service import WorkerService

from .support import eventually_async

STREAM = StreamConfig(
    resolution=Resolution(320, 240), fps=30.0, encoder="x264", renderer="cpu", codecs=("H264",)
)
SID = "5" * 32
ZOOM = {"type": "wheel", "dy": 120}
CONNECT_S = 20.0


def viewer_id(n: int) -> str:
    return f"{n:032x}"


class Page:
    """A browser's page as aiortc plays it: a receive-only video transceiver offering
    `codecs`, the `input` channel, every decoded frame counted (and when it came)."""

    def __init__(self, codecs: tuple[str, ...] = ("H264",)) -> None:
        self.pc = RTCPeerConnection()
        transceiver = self.pc.addTransceiver("video", direction="recvonly")
        wanted = {f"video/{c}".lower() for c in codecs} | {"video/rtx"}
        capabilities = RTCRtpReceiver.getCapabilities("video")
        assert capabilities is not None
        offered = [c for c in capabilities.codecs if c.mimeType.lower() in wanted]
        transceiver.setCodecPreferences(offered)
        self.channel = self.pc.createDataChannel("input")
        self.moves = self.pc.createDataChannel("moves", ordered=False)  # as the SDK's
        self.opened = asyncio.Event()
        self.channel.on("open", self.opened.set)
        self.messages: list[dict[str, Any]] = []
        self.channel.on("message", lambda data: self.messages.append(json.loads(data)))
        self.frame_times: list[float] = []
        self._reader: asyncio.Task[None] | None = None
        self.pc.on("track", self._on_track)

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._reader = asyncio.ensure_future(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()  # a decoded frame: the decoder had what it needed
                self.frame_times.append(time.monotonic())
        except MediaStreamError:
            pass

    @property
    def frames(self) -> int:
        return len(self.frame_times)

    def frames_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.frame_times if start <= t < end)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def answered(self, sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
        await asyncio.wait_for(self.opened.wait(), CONNECT_S)
        await eventually_async(lambda: self.moves.readyState == "open", CONNECT_S, what="moves")

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def message(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 10.0
    ) -> dict[str, Any]:
        """The first message so far or to come that `predicate` accepts."""

        def found() -> dict[str, Any] | None:
            return next((m for m in self.messages if predicate(m)), None)

        return cast(dict[str, Any], await eventually_async(found, timeout, what=str(predicate)))

    async def presence(self, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The newest `presence` once it passes `check`."""

        def newest() -> dict[str, Any] | None:
            said = [m for m in self.messages if m["type"] == "presence"]
            return said[-1] if said and check(said[-1]) else None

        return cast(dict[str, Any], await eventually_async(newest, 10.0, what="presence"))

    async def streaming(self, frames: int = 3) -> None:
        start = self.frames
        await eventually_async(lambda: self.frames >= start + frames, CONNECT_S, what="frames")

    def freeze(self) -> None:
        """The page's machine hangs: nothing it receives is read, nothing leaves it (its
        sockets stay open: no ICE or DTLS goodbye)."""
        for transceiver in self.pc.getTransceivers():
            ice = transceiver.receiver.transport.transport
            for protocol in ice._connection._protocols:
                protocol.datagram_received = lambda data, addr: None  # type: ignore[method-assign]
                protocol.transport.sendto = lambda data, addr=None: None  # type: ignore[method-assign]

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()


class Worker:
    """A worker service as signaling drives it; what it says back is kept in `replies`."""

    def __init__(self, scene: Scene, **stream: Any) -> None:
        self.metrics = Metrics()
        local = LocalWorker("w", scene, replace(STREAM, **stream), 2, self.metrics)
        self.service = WorkerService(local, self._send)
        self.replies: list[ToSignaling] = []
        self.pages: list[Page] = []

    async def _send(self, message: ToSignaling) -> None:
        self.replies.append(message)

    @property
    def session(self) -> StreamSession:
        return self.service.sessions[SID]

    async def reply(self, predicate: Callable[[ToSignaling], bool]) -> ToSignaling:
        def found() -> ToSignaling | None:
            return next((m for m in self.replies if predicate(m)), None)

        return await eventually_async(found, CONNECT_S, what=str(predicate))

    async def open(self, name: str | None = "alice") -> None:
        await self.service.handle(OpenSession(SID, name=name))

    async def owner(self, codecs: tuple[str, ...] = ("H264",)) -> Page:
        page = Page(codecs)
        self.pages.append(page)
        await self.service.handle(SessionOffer(SID, await page.offer()))
        answer = self.replies[-1]
        assert isinstance(answer, WorkerAnswer), answer
        await page.answered(answer.sdp)
        return page

    async def offer(self, n: int, name: str, codecs: tuple[str, ...] = ("H264",)) -> Page:
        """A viewer's page offers; its answer or ending is the latest reply."""
        page = Page(codecs)
        self.pages.append(page)
        await self.service.handle(ViewerOffer(SID, viewer_id(n), await page.offer(), name))
        return page

    async def viewer(self, n: int, name: str) -> Page:
        page = await self.offer(n, name)
        answer = self.replies[-1]
        assert isinstance(answer, ViewerAnswer), answer
        assert answer.viewer_id == viewer_id(n)
        await page.answered(answer.sdp)
        return page

    def ended(self, n: int) -> ViewerEnded | None:
        vid = viewer_id(n)
        return next(
            (m for m in self.replies if isinstance(m, ViewerEnded) and m.viewer_id == vid), None
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    async def close(self) -> None:
        for page in self.pages:
            await page.close()
        await self.service.close_all("test_done")


@pytest.fixture
async def worker(scene: Scene) -> AsyncIterator[Worker]:
    serving = Worker(scene)
    yield serving
    await asyncio.wait_for(serving.close(), 30)


def _steering(who: str) -> Callable[[dict[str, Any]], bool]:
    return lambda presence: presence["steering"] == who


def _error(code: str) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["type"] == "error" and m.get("code") == code


async def test_the_owner_and_two_viewers_get_each_frame_encoded_once(worker: Worker) -> None:
    await worker.open("alice")
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    for page in (owner, bob, carol):
        await page.streaming()

    # presence: every page, with its own id, the names, who steers
    everyone = [(OWNER_PEER, "alice", "owner"), (viewer_id(1), "Bob", "viewer"),
                (viewer_id(2), "Carol", "viewer")]  # fmt: skip

    def all_three(presence: dict[str, Any]) -> bool:
        peers = [(p["id"], p["name"], p["role"]) for p in presence["peers"]]
        return sorted(peers) == sorted(everyone) and presence["steering"] == OWNER_PEER

    for page, you in ((owner, OWNER_PEER), (bob, viewer_id(1)), (carol, viewer_id(2))):
        presence = await page.presence(all_three)
        assert (presence["you"], presence["maxViewers"]) == (you, 8)

    # one encode per frame: count the encoder's calls over two seconds of streaming
    session = worker.session
    encoder = session.pipeline.encoder
    encode = encoder.encode
    calls = 0

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return encode(*args, **kwargs)

    encoder.encode = counted  # type: ignore[method-assign]
    start, frames_before = time.monotonic(), session.frames
    encoded_before = worker.metric("worker_frames_encoded_total")
    await asyncio.sleep(2.0)
    end = time.monotonic()
    encoded = session.frames - frames_before
    assert encoded >= 10, f"{encoded} frames in 2 s"
    assert calls == encoded  # every frame handed on was encoded once, whoever gets it
    assert worker.metric("worker_frames_encoded_total") - encoded_before == encoded
    # ... and every page decoded about as many (the frames in flight at either end aside)
    received = [page.frames_between(start, end) for page in (owner, bob, carol)]
    for got in received:
        assert abs(got - encoded) <= max(3, encoded // 5), (received, encoded)
    assert worker.metric("worker_viewers") == 2
    assert worker.metric("worker_viewer_joins_total", outcome="answered") == 2
    assert worker.metric("worker_viewer_frames_total", outcome="sent") >= 2 * encoded - 6


async def test_a_viewer_steers_only_when_handed_control(worker: Worker) -> None:
    await worker.open("alice")
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    camera = worker.session.input.controller.camera
    for page in (owner, bob, carol):
        await page.presence(lambda p: len(p["peers"]) == 3)

    # a viewer's steering input and quality requests change nothing
    distance = camera.distance
    bob.send(ZOOM)
    bob.send({"type": "quality", "width": 640, "height": 480})
    bob.send({"type": "command", "id": 1, "name": "setCamera", "args": {"yaw": 1.0}})
    bob.send({"type": "command", "id": 2, "name": "getCamera"})
    refused = await bob.message(_error("forbidden"))
    assert "alice steers" in refused["message"]
    await bob.message(lambda m: m["type"] == "error" and "owner" in m["message"])  # quality
    assert (await bob.message(lambda m: m.get("id") == 1))["code"] == "forbidden"
    assert (await bob.message(lambda m: m.get("id") == 2))["type"] == "result"  # read-only
    bob.send({"type": "ping", "id": 3, "t": 1.0})
    await bob.message(lambda m: m["type"] == "pong" and m["id"] == 3)
    assert camera.distance == distance
    assert worker.session.quality.resolution == Resolution(320, 240)

    # on its `moves` channel only moves: a command there is refused before anything else
    bob.moves.send(json.dumps({"type": "command", "id": 9, "name": "getCamera"}))
    assert "`command`" in (await bob.message(_error("wrong_channel")))["message"]
    # a viewer may not hand control it does not have, nor take it
    bob.send({"type": "command", "id": 4, "name": "control.take"})
    assert (await bob.message(lambda m: m.get("id") == 4))["code"] == "forbidden"
    # the owner hands control to Bob: everyone hears it, and Bob's input moves the camera
    owner.send({"type": "command", "id": 5, "name": "control.hand", "args": {"to": viewer_id(1)}})
    handed = await owner.message(lambda m: m.get("id") == 5)
    assert handed == {"type": "result", "id": 5, "name": "control.hand",
                      "value": {"steering": viewer_id(1)}}  # fmt: skip
    for page in (owner, bob, carol):
        await page.presence(_steering(viewer_id(1)))
    bob.moves.send(json.dumps(ZOOM))  # through the unordered channel, as the SDK sends it
    await eventually_async(lambda: camera.distance != distance, 10, what="Bob's zoom")
    # ... the owner's and Carol's are refused, naming Bob
    distance = camera.distance
    owner.send(ZOOM)
    carol.send(ZOOM)
    assert "Bob steers" in (await owner.message(_error("forbidden")))["message"]
    assert "Bob steers" in (await carol.message(_error("forbidden")))["message"]
    await asyncio.sleep(0.2)
    assert camera.distance == distance
    # the steering viewer may hand it on; the owner takes it back
    bob.send({"type": "command", "id": 6, "name": "control.hand", "args": {"to": viewer_id(2)}})
    await bob.message(lambda m: m.get("id") == 6 and m["type"] == "result")
    await carol.presence(_steering(viewer_id(2)))
    owner.send({"type": "command", "id": 7, "name": "control.take", "args": {}})
    await owner.message(lambda m: m.get("id") == 7 and m["type"] == "result")
    for page in (owner, bob, carol):
        await page.presence(_steering(OWNER_PEER))
    owner.messages.clear()
    owner.send(ZOOM)
    await eventually_async(lambda: camera.distance != distance, 10, what="the owner's zoom")
    assert not [m for m in owner.messages if m["type"] == "error"]
    assert worker.metric("worker_input_rejected_total", code="forbidden") >= 4


async def test_a_steering_viewer_that_leaves_gives_control_back(worker: Worker) -> None:
    await worker.open(None)  # an anonymous owner
    owner = await worker.owner()
    await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    await owner.presence(lambda p: len(p["peers"]) == 3)
    owner.send({"type": "command", "id": 1, "name": "control.hand", "args": {"to": viewer_id(1)}})
    await owner.presence(_steering(viewer_id(1)))
    await carol.streaming()

    await worker.service.handle(ViewerLeave(SID, viewer_id(1), "left"))
    presence = await owner.presence(_steering(OWNER_PEER))
    assert [(p["id"], p["name"]) for p in presence["peers"]] == [
        (OWNER_PEER, "host"), (viewer_id(2), "Carol"),
    ]  # fmt: skip
    await carol.presence(lambda p: len(p["peers"]) == 2)
    assert worker.ended(1) is None  # the page left: nothing to tell it
    assert worker.metric("worker_viewers") == 1
    # the others stream on
    for page in (owner, carol):
        await page.streaming(5)


async def test_the_owner_removes_one_viewer_and_the_others_stream_on(worker: Worker) -> None:
    await worker.open("alice")
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    await owner.presence(lambda p: len(p["peers"]) == 3)
    owner.send({"type": "command", "id": 1, "name": "control.hand", "args": {"to": viewer_id(1)}})
    await bob.presence(_steering(viewer_id(1)))

    # what may not remove, or whom: each refused with its reason, nobody removed
    remove = {"type": "command", "name": "control.remove"}
    carol.send({**remove, "id": 2, "args": {"peer": viewer_id(1)}})
    bob.send({**remove, "id": 3, "args": {"peer": viewer_id(2)}})  # steering is not owning
    for args, id_ in (({}, 4), ({"peer": 7}, 5), ({"peer": viewer_id(1), "x": 1}, 6),
                      ({"peer": viewer_id(9)}, 7), ({"peer": OWNER_PEER}, 8)):  # fmt: skip
        owner.send({**remove, "id": id_, "args": args})
    assert (await carol.message(lambda m: m.get("id") == 2))["code"] == "forbidden"
    assert (await bob.message(lambda m: m.get("id") == 3))["code"] == "forbidden"
    for id_ in range(4, 9):
        assert (await owner.message(lambda m, i=id_: m.get("id") == i))["code"] == "bad_command"
    assert worker.ended(1) is None and worker.ended(2) is None

    # the owner removes Bob, who steered: Bob's stream ends for good, control comes home
    owner.send({**remove, "id": 10, "args": {"peer": viewer_id(1)}})
    removed = await owner.message(lambda m: m.get("id") == 10)
    assert removed == {"type": "result", "id": 10, "name": "control.remove",
                       "value": {"removed": viewer_id(1)}}  # fmt: skip
    ended = cast(ViewerEnded, await worker.reply(lambda m: m == worker.ended(1)))
    assert (ended.code, ended.message) == (REMOVED, "alice removed you from this session")
    for page in (owner, carol):
        presence = await page.presence(lambda p: len(p["peers"]) == 2)
        assert presence["steering"] == OWNER_PEER
        assert viewer_id(1) not in [peer["id"] for peer in presence["peers"]]
    assert worker.metric("worker_viewers") == 1
    assert worker.metric("worker_viewers_removed_total") == 1
    await eventually_async(lambda: bob.pc.connectionState == "closed", 10, what="Bob let go")
    for page in (owner, carol):
        await page.streaming(5)
    # removing Bob again: nobody by that id watches
    owner.send({**remove, "id": 11, "args": {"peer": viewer_id(1)}})
    assert (await owner.message(lambda m: m.get("id") == 11))["code"] == "bad_command"
    assert worker.metric("worker_viewers_removed_total") == 1


async def test_refused_viewers(scene: Scene) -> None:
    """Over --max-viewers, with sharing off, or with an offer without the session's codec."""
    worker = Worker(scene, max_viewers=1)
    try:
        await worker.open()
        await worker.offer(1, "Bob")
        assert isinstance(worker.replies[-1], ViewerAnswer)
        await worker.offer(2, "Carol")
        refused = worker.replies[-1]
        assert isinstance(refused, ViewerEnded)
        assert (refused.viewer_id, refused.code) == (viewer_id(2), TOO_MANY_VIEWERS)
        await worker.offer(3, "Dave", codecs=("VP8",))
        refused = worker.replies[-1]
        assert isinstance(refused, ViewerEnded)
        # the limit first: leave room for Dave to be judged on his codec
        await worker.service.handle(ViewerLeave(SID, viewer_id(1), "left"))
        await worker.offer(3, "Dave", codecs=("VP8",))
        refused = worker.replies[-1]
        assert isinstance(refused, ViewerEnded) and refused.code == "bad_offer"
        assert "H264" in refused.message and "VP8" in refused.message
        worker.session.viewers.max_viewers = 0
        await worker.offer(4, "Erin")
        refused = worker.replies[-1]
        assert isinstance(refused, ViewerEnded) and refused.code == SHARING_OFF
        joins = {
            outcome: worker.metric("worker_viewer_joins_total", outcome=outcome)
            for outcome in ("answered", TOO_MANY_VIEWERS, "bad_offer", SHARING_OFF)
        }
        assert joins == {"answered": 1, TOO_MANY_VIEWERS: 2, "bad_offer": 1, SHARING_OFF: 1}
        # a session that is not here: its viewers are told it ended (a leaving page: nothing)
        other = "6" * 32
        count = len(worker.replies)
        await worker.service.handle(ViewerOffer(other, viewer_id(5), "v=0\r\n", "Fay"))
        await worker.service.handle(ViewerIce(other, viewer_id(5), "", None, None))
        await worker.service.handle(ViewerLeave(other, viewer_id(5), "left"))
        told = worker.replies[count:]
        assert [(m.type, getattr(m, "code", None)) for m in told] == [
            ("viewer.ended", SESSION_ENDED), ("viewer.ended", SESSION_ENDED),
        ]  # fmt: skip
    finally:
        await asyncio.wait_for(worker.close(), 30)


async def test_a_frozen_viewer_loses_its_own_frames_and_is_let_go(worker: Worker) -> None:
    await worker.open()
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    worker.session.viewers.silence_s = 2.0
    for page in (owner, bob, carol):
        await page.streaming()
    await asyncio.sleep(1.5)
    frozen_at = time.monotonic()
    rates = {id(p): p.frames_between(frozen_at - 1.5, frozen_at) / 1.5 for p in (owner, carol)}
    bob.freeze()
    assert worker.ended(1) is None
    ended = await eventually_async(lambda: worker.ended(1), 10, what="Bob let go")
    let_go_s = time.monotonic() - frozen_at
    assert ended.code == PEER_LOST, ended
    # 2 s after the last RTCP Bob sent before he froze (his receiver reports come each
    # 0.5..1.5 s), found within half a second
    assert let_go_s < 4.0, let_go_s
    now = time.monotonic()
    for page in (owner, carol):  # they never waited for Bob
        rate = page.frames_between(frozen_at, now) / (now - frozen_at)
        assert rate >= 0.7 * rates[id(page)], (rate, rates[id(page)])
    assert bob.frames_between(frozen_at + 0.5, now) == 0
    assert worker.metric("worker_viewers") == 1
    await owner.presence(lambda p: [v["id"] for v in p["peers"]] == [OWNER_PEER, viewer_id(2)])
    await carol.streaming(5)


async def test_a_quiet_owner_pauses_the_frames_only_once_no_viewer_watches(worker: Worker) -> None:
    await worker.open()
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    for page in (owner, bob):
        await page.streaming()
    owner.freeze()  # no RTCP from the owner: tests/test_quiet_peer.py has it pause alone
    frozen_at = time.monotonic()
    await asyncio.sleep(PEER_QUIET_S + 2)
    assert worker.metric("worker_session_pauses_total") == 0
    assert bob.frames_between(frozen_at + PEER_QUIET_S + 1, time.monotonic()) >= 5  # Bob watches on
    await worker.service.handle(ViewerLeave(SID, viewer_id(1), "left"))
    await eventually_async(
        lambda: worker.metric("worker_session_pauses_total") == 1, 3, what="paused once alone"
    )


async def test_a_viewer_that_cannot_be_sent_to_drops_its_own_frames(worker: Worker) -> None:
    await worker.open()
    owner = await worker.owner()
    bob = await worker.viewer(1, "Bob")
    carol = await worker.viewer(2, "Carol")
    for page in (owner, bob, carol):
        await page.streaming()
    await asyncio.sleep(1.0)
    # Bob's sends block (a socket that never drains): his sender stops taking frames
    peer = worker.session.viewers.peers[viewer_id(1)]
    dtls = peer.pc.getSenders()[0].transport
    unblocked = asyncio.Event()
    send_rtp = dtls._send_rtp

    async def blocked(data: bytes) -> None:
        await unblocked.wait()
        await send_rtp(data)

    dtls._send_rtp = blocked  # type: ignore[method-assign]
    stalled_at = time.monotonic()
    keyframes = worker.session.pipeline.keyframes.requests
    rates = {id(p): p.frames_between(stalled_at - 1.0, stalled_at) for p in (owner, carol)}
    await asyncio.sleep(2.0)
    now = time.monotonic()
    for page in (owner, carol):  # they never waited for Bob
        rate = page.frames_between(stalled_at, now) / (now - stalled_at)
        assert rate >= 0.7 * rates[id(page)], (rate, rates[id(page)])
    track = peer.track
    assert track is not None
    assert track.dropped >= 10, track.dropped
    assert worker.metric("worker_viewer_frames_total", outcome="dropped") == track.dropped
    # Bob asked for a keyframe, once a second at most
    assert 1 <= worker.session.pipeline.keyframes.requests - keyframes <= 4
    # his path clears: he streams again from a keyframe
    unblocked.set()
    dtls._send_rtp = send_rtp  # type: ignore[method-assign]
    await bob.streaming(5)
    assert worker.ended(1) is None


async def test_a_viewer_that_never_connects_is_let_go(scene: Scene) -> None:
    worker = Worker(scene, connect_timeout_s=1.0)
    try:
        await worker.open()
        await worker.owner()
        await worker.offer(1, "Bob")  # its page never takes the answer
        assert isinstance(worker.replies[-1], ViewerAnswer)
        ended = await eventually_async(lambda: worker.ended(1), 5, what="Bob let go")
        assert (ended.code, ended.message) == (PEER_LOST, "it never connected")
        assert SID in worker.service.sessions  # the session goes on
    finally:
        await asyncio.wait_for(worker.close(), 30)


async def test_viewers_of_another_codec_watch_again(scene: Scene) -> None:
    """The owner's page reloads in a browser that takes another codec: the viewers sent the
    old one are told to watch again (`peer_lost` is retried), and are answered in the new."""
    worker = Worker(scene, codecs=("H264", "VP8"))
    try:
        await worker.open()
        await worker.owner(("H264",))
        await worker.viewer(1, "Bob")
        await worker.owner(("VP8",))
        assert worker.session.pipeline.codec == "VP8"
        ended = cast(ViewerEnded, worker.ended(1))
        assert ended.code == PEER_LOST and "VP8" in ended.message
        await worker.offer(2, "Bob", codecs=("H264", "VP8"))
        assert isinstance(worker.replies[-1], ViewerAnswer)
        assert worker.session.viewers.peers[viewer_id(2)].codec == "VP8"
    finally:
        await asyncio.wait_for(worker.close(), 30)


async def test_the_sessions_end_ends_every_viewer(worker: Worker) -> None:
    await worker.open()
    owner = await worker.owner()
    await worker.viewer(1, "Bob")
    await worker.viewer(2, "Carol")
    await owner.presence(lambda p: len(p["peers"]) == 3)
    await worker.service.handle(CloseSession(SID, "closed"))
    codes = [(e.viewer_id, e.code) for e in (worker.ended(1), worker.ended(2)) if e]
    assert sorted(codes) == [(viewer_id(1), SESSION_ENDED), (viewer_id(2), SESSION_ENDED)]
    last = worker.replies[-1]  # the viewers first, then the session
    assert isinstance(last, WorkerSessionEnded) and last.reason == "closed"
    assert worker.metric("worker_viewers") == 0
    # an offer that comes too late is told the session ended
    await worker.service.handle(ViewerOffer(SID, viewer_id(3), "v=0\r\n", "Dave"))
    assert cast(ViewerEnded, worker.ended(3)).code == SESSION_ENDED


async def test_stopping_sharing_ends_the_viewers_and_the_owner_streams_on(
    worker: Worker,
) -> None:
    await worker.open()
    owner = await worker.owner()
    await worker.viewer(1, "Bob")
    await worker.viewer(2, "Carol")
    await owner.presence(lambda p: len(p["peers"]) == 3)
    await worker.service.handle(ViewersEnd(SID, REVOKED, "the owner stopped sharing"))
    codes = [(e.viewer_id, e.code) for e in (worker.ended(1), worker.ended(2)) if e]
    assert sorted(codes) == [(viewer_id(1), REVOKED), (viewer_id(2), REVOKED)]
    await owner.presence(lambda p: len(p["peers"]) == 1)
    assert worker.metric("worker_viewers") == 0
    await owner.streaming(5)
    # sharing again: a new viewer joins the same session
    await worker.viewer(3, "Dave")
    await owner.presence(lambda p: len(p["peers"]) == 2)


async def test_a_moved_sessions_viewers_are_told_to_watch_again(worker: Worker) -> None:
    await worker.open()
    await worker.offer(1, "Bob")  # answered; no need to connect
    await worker.service.handle(CloseSession(SID, MOVED))
    assert cast(ViewerEnded, worker.ended(1)).code == MOVED


async def test_a_worker_pool_routes_viewers_to_their_sessions_child() -> None:
    """`--processes`: a viewer's messages go to the child serving its session, the child's
    answers come back; a session no child serves ends its viewers."""
    children = [Child(0, 1), Child(1, 1)]  # not started: what they are sent waits in `pending`
    told: list[ToSignaling] = []

    async def send(message: ToSignaling) -> None:
        told.append(message)

    pool = cast(WorkerPool, SimpleNamespace(children=children))
    service = PoolService(pool, cast(LocalWorker, SimpleNamespace()), send)
    service.submit(OpenSession(SID))
    child = service.placed[SID]
    requests: list[ViewerRequest] = [
        ViewerOffer(SID, viewer_id(1), "v=0\r\n", "Bob"),
        ViewerIce(SID, viewer_id(1), "candidate:1 1 udp 1 127.0.0.1 9 typ host", "0", 0),
        ViewerLeave(SID, viewer_id(1), "left"),
    ]
    for request in requests:
        service.submit(request)
    assert [frame["message"] for frame in child.pending[1:]] == requests
    other = "6" * 32
    service.submit(ViewerOffer(other, viewer_id(2), "v=0\r\n", "Carol"))
    service.submit(ViewerLeave(other, viewer_id(2), "left"))  # nothing to tell a page that left
    service._reply(child, ViewerAnswer(SID, viewer_id(1), "v=0\r\n"))
    service._reply(child, ViewerEnded(SID, viewer_id(1), PEER_LOST, "gone"))
    await eventually_async(lambda: len(told) == 3)
    assert told == [
        ViewerEnded(other, viewer_id(2), SESSION_ENDED, "the session ended"),
        ViewerAnswer(SID, viewer_id(1), "v=0\r\n"),
        ViewerEnded(SID, viewer_id(1), PEER_LOST, "gone"),
    ]
    # the children's viewer figures add up on the worker's /metrics
    parent, child_metrics = Metrics(), Metrics()
    child_metrics.viewers_connected.inc(2)
    child_metrics.viewer_frames.labels("sent").inc(30)
    parent.children = {0: (101, child_metrics.render()), 1: (202, child_metrics.render())}
    families = {f.name: f for f in text_string_to_metric_families(parent.render().decode())}
    assert sum(s.value for s in families["worker_viewers"].samples) == 4
    sent = [s for s in families["worker_viewer_frames"].samples if s.name.endswith("_total")]
    assert sum(s.value for s in sent) == 60


# -- the fan-out track ---------------------------------------------------------------------------


async def test_a_viewer_that_falls_behind_drops_until_a_keyframe() -> None:
    now = [0.0]
    asked: list[float] = []
    counted: list[bool] = []
    track = FanOutTrack(lambda: asked.append(now[0]), counted.append, clock=lambda: now[0])
    frames = [av.Packet(bytes([n])) for n in range(12)]  # the track only hands them on
    track.push(frames[0], True)  # before its sender reads (not connected): nothing queued
    first = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)
    assert asked == [0.0]  # the sender started: a keyframe, please
    track.push(frames[1], False)  # no decoder starts from this one
    track.push(frames[2], True)
    assert await first is frames[2]  # the very packet object, not a copy
    for frame in frames[3:7]:  # three fit; the fourth finds the queue full
        track.push(frame, False)
    assert (track.dropped, counted.count(False)) == (1, 1)
    now[0] = 0.5
    track.push(frames[7], False)  # dropped: it depends on the one lost
    assert asked == [0.0]  # asked at most once a second
    now[0] = 1.2
    track.push(frames[8], False)
    assert asked == [0.0, 1.2]
    assert [await track.recv() for _ in range(3)] == frames[3:6]
    track.push(frames[9], True)  # the keyframe: it streams again
    track.push(frames[10], False)
    assert [await track.recv() for _ in range(2)] == frames[9:11]
    assert (track.sent, track.dropped) == (6, 3)
    assert counted.count(True) == 6
    waiting = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)
    track.stop()
    with pytest.raises(MediaStreamError):
        await waiting


def test_max_viewers_is_checked_and_reaches_the_config() -> None:
    from render_server.cli.main import build_parser
    from render_server.cli.options import server_config, worker_config

    with pytest.raises(ConfigError, match="max viewers"):
        StreamConfig(max_viewers=-1)
    assert server_config(build_parser().parse_args(["serve"])).stream.max_viewers == 8
    args = build_parser().parse_args(["serve", "--max-viewers", "0"])
    assert server_config(args).stream.max_viewers == 0
    args = build_parser().parse_args(["worker", "--signaling", "ws://x/worker", "--max-viewers",
                                      "3"])  # fmt: skip
    assert worker_config(args).stream.max_viewers == 3
