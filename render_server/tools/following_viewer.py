"""A Python page that follows its session through faults, as the browser SDK does: a worker that
drains (`session.moving`, then `session.started` naming another worker), a worker that is lost
(`session.interrupted`), a replica that stops or dies (the socket closes: resume on the next
replica's URL). It records when each video frame arrived, so that the fault tests and
`benchmarks/chaos.py` can say how long the picture stood still and whether the rate held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from render_server.encode.codecs import CODECS
from render_server.protocol.wire import PROTOCOL_VERSION
from render_server.tools.signaling_client import json_object, signaling_url
from render_server.transport.feedback_generator import send_transport_feedback
from render_server.transport.playout_delay import register_playout_delay
from render_server.transport.video_sender import codec_preferences

RESUME_AT_ONCE = (1001, 1012, 1013)  # a replica stopping on purpose: no backoff
BACKOFF_S = 0.25
CLOSE_STEP_S = 5.0


@dataclass
class Peer:
    pc: RTCPeerConnection
    worker_id: str
    channel: Any
    results: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class FollowingViewer:
    def __init__(self, urls: list[str], token: str | None = None, name: str = "") -> None:
        self.urls = [signaling_url(u) for u in urls]
        self.token = token
        self.name = name
        self.frames: list[float] = []  # time.monotonic() of each frame's arrival
        self.workers: list[str] = []  # the workers streamed from, in order
        self.messages: list[tuple[float, dict[str, Any]]] = []  # signaling messages received
        self.session_id: str | None = None
        self.resume_token: str | None = None
        self.ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.peer: Peer | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._http: aiohttp.ClientSession | None = None
        self._runner: asyncio.Task[None] | None = None
        self._next_id = 1
        self._url_index = 0
        self._first_frame = asyncio.Event()
        self._closing = False

    # -- the page's life --------------------------------------------------------------------

    def begin(self) -> None:
        """Ask for a session (it may wait in the queue); frames follow when it is served, decoded
        by aiortc in whichever codec the worker answers (AV1 too: video_sender registers it)."""
        register_playout_delay()
        self._http = aiohttp.ClientSession()
        self._runner = asyncio.get_running_loop().create_task(self._run())

    def streaming(self, within_s: float = 1.0) -> bool:
        """A frame arrived within the last `within_s` seconds."""
        return bool(self.frames) and time.monotonic() - self.frames[-1] < within_s

    @property
    def gone(self) -> bool:
        """Closed or dropped by its owner (not by the server)."""
        return self._closing

    @property
    def queued(self) -> bool:
        """The last word from signaling was a queue place."""
        kinds = [m.get("type") for _, m in self.messages if m.get("type") != "answer"]
        return bool(kinds) and kinds[-1] == "queue"

    async def drop(self) -> None:
        """Vanish as a killed tab does: no `session.end`, the socket and peer just go."""
        self._closing = True
        if self._runner is not None:
            self._runner.cancel()
        await self._drop_peer()
        if self._http is not None:
            await _bounded(self._http.close())

    async def start(self, timeout: float = 30.0) -> None:
        """Start a session and wait for its first frame."""
        self.begin()
        assert self._runner is not None
        waiter: asyncio.Future[Any] = asyncio.ensure_future(self._first_frame.wait())
        pending: set[asyncio.Future[Any]] = {waiter, self.ended, self._runner}
        done, _ = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            waiter.cancel()
            raise TimeoutError(f"{self.name}: no frame in {timeout} s ({self._story()})")

    async def close(self) -> None:
        """End the session and let go of everything; each step bounded (a peer or a socket
        whose other end is gone must not hold the caller)."""
        self._closing = True
        await _bounded(self._send({"type": "session.end"}))
        await self._drop_peer()
        if self._runner is not None:
            self._runner.cancel()
            await _bounded(asyncio.wait([self._runner]))
        if self._ws is not None:
            await _bounded(self._ws.close())
        if self._http is not None:
            await _bounded(self._http.close())

    async def command(self, name: str, args: dict[str, Any] | None = None) -> Any:
        """Run a scene command on the worker now streaming; its result."""
        peer = self.peer
        if peer is None:
            raise RuntimeError("no stream")
        request_id, self._next_id = self._next_id, self._next_id + 1
        future = asyncio.get_running_loop().create_future()
        peer.results[request_id] = future
        message = {"type": "command", "id": request_id, "name": name, "args": args or {}}
        peer.channel.send(json.dumps(message))
        async with asyncio.timeout(10):
            return await future

    # -- what the frames say ------------------------------------------------------------------

    def frames_between(self, t0: float, t1: float) -> int:
        return sum(1 for t in self.frames if t0 <= t < t1)

    def first_frame_after(self, t: float) -> float | None:
        return next((f for f in self.frames if f >= t), None)

    def longest_gap(self, t0: float, t1: float) -> float:
        """The longest time without a frame within [t0, t1] (edges included)."""
        times = [t0, *(f for f in self.frames if t0 <= f <= t1), t1]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    # -- internals ---------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._http is not None
        delay = 0.0
        while not self._closing and not self.ended.done():
            url = self.urls[self._url_index % len(self.urls)]
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            code = None
            try:
                async with self._http.ws_connect(url, headers=headers) as ws:
                    self._ws = ws
                    if self.session_id is None:
                        await self._send({"type": "session.start"})
                    else:
                        await self._send({"type": "session.resume", "sessionId": self.session_id,
                                          "resumeToken": self.resume_token})  # fmt: skip
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        message = json_object(msg.data)
                        if message is not None:
                            await self._on_message(message)
                    code = ws.close_code
            except (aiohttp.ClientError, OSError):
                pass
            self._ws = None
            if self.ended.done() or self._closing:
                return
            self._url_index += 1  # the next replica
            delay = 0.0 if code in RESUME_AT_ONCE else min(2.0, max(BACKOFF_S, delay * 2))
            await asyncio.sleep(delay)

    async def _on_message(self, message: dict[str, Any]) -> None:
        self.messages.append((time.monotonic(), message))
        kind = message.get("type")
        if kind == "session.started":
            self.session_id = message["sessionId"]
            self.resume_token = message.get("resumeToken") or self.resume_token
            worker = message["workerId"]
            peer = self.peer
            if peer is None or peer.worker_id != worker or peer.pc.connectionState != "connected":
                await self._negotiate(worker)
        elif kind == "queue":
            self.session_id = message.get("sessionId") or self.session_id
            self.resume_token = message.get("resumeToken") or self.resume_token
        elif kind == "answer" and self.peer is not None:
            with contextlib.suppress(Exception):
                answer = RTCSessionDescription(sdp=message["sdp"], type="answer")
                await self.peer.pc.setRemoteDescription(answer)
        elif kind == "session.interrupted":
            await self._drop_peer()
        elif kind == "session.ended" and not self.ended.done():
            self.ended.set_result(str(message.get("reason")))
        elif kind == "error" and message.get("code") in ("unknown_session", "forbidden"):
            if not self.ended.done():
                self.ended.set_result(str(message.get("code")))

    async def _negotiate(self, worker: str) -> None:
        await self._drop_peer()
        pc = RTCPeerConnection()
        transceiver = pc.addTransceiver("video", direction="recvonly")
        send_transport_feedback(transceiver.receiver)  # as a browser's: the worker paces on it
        # the SDK's order for a browser that decodes all three in software (aiortc's own
        # would put VP8 first)
        transceiver.setCodecPreferences(codec_preferences(*CODECS))
        channel = pc.createDataChannel("input")
        peer = Peer(pc, worker, channel)
        channel.on("message", lambda data: self._on_channel(peer, data))
        pc.on("track", lambda track: peer.tasks.append(asyncio.create_task(self._frames(track))))
        self.peer = peer
        self.workers.append(worker)
        await pc.setLocalDescription(await pc.createOffer())
        await self._send({"type": "offer", "sdp": pc.localDescription.sdp})

    def _on_channel(self, peer: Peer, data: str | bytes) -> None:
        message = json_object(data)
        if message is None or message.get("type") not in ("result", "error"):
            return
        future = peer.results.pop(message.get("id", -1), None)
        if future is not None and not future.done():
            if message["type"] == "result":
                future.set_result(message.get("value"))
            else:
                future.set_exception(RuntimeError(f"{message.get('code')}: {message}"))

    async def _frames(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()
                self.frames.append(time.monotonic())
                self._first_frame.set()

    async def _drop_peer(self) -> None:
        peer, self.peer = self.peer, None
        if peer is None:
            return
        for task in peer.tasks:
            task.cancel()
        await _bounded(peer.pc.close())

    async def _send(self, message: dict[str, Any]) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.send_str(json.dumps({"v": PROTOCOL_VERSION, **message}))

    def _story(self) -> str:
        return ", ".join(str(m.get("type")) + (f"({m.get('code') or m.get('reason')})"
                         if m.get("code") or m.get("reason") else "")
                         for _, m in self.messages[-8:])  # fmt: skip


async def _bounded(step: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(CLOSE_STEP_S):
            await step
