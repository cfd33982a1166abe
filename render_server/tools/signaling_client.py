"""A Python program's end of one session's signaling socket (`/ws`): the viewer the tests use,
the latency client and the load-test harness all open their sessions through it.

It starts a session, trades the offer for the answer and ends the session; every other server
message (queue positions, `session.interrupted`, errors after the start) goes to `on_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import aiohttp
from aiortc import (
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCRtpReceiver,
    RTCSessionDescription,
)

from render_server.protocol.errors import ProtocolError
from render_server.protocol.json_reader import JsonLimits, read_json
from render_server.protocol.wire import PROTOCOL_VERSION
from render_server.transport.delayed_sack import delay_sacks
from render_server.transport.feedback_generator import send_transport_feedback
from render_server.transport.playout_delay import register_playout_delay
from render_server.transport.video_sender import codec_preferences


class SignalingError(RuntimeError):
    """The server refused or failed the session before it was up; `code` as on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def signaling_url(url: str) -> str:
    """`http(s)://host:port[/]` or a `ws(s)://` URL → the browser signaling socket's URL."""
    if url.startswith(("ws://", "wss://")):
        return url
    base = url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://") + "/ws"
    if base.startswith("http://"):
        return "ws://" + base.removeprefix("http://") + "/ws"
    raise ValueError(f"{url!r} is not an http(s):// or ws(s):// URL")


# What a client takes from a server: the largest message is a relayed SDP answer (signaling) or a
# big scene's `listScene` (the data channel, 64 KiB at most by aiortc's SCTP); bounded all the
# same, so that a hostile server cannot exhaust a client.
FROM_SERVER_JSON = JsonLimits(max_bytes=1 << 20, max_depth=32, max_items=1 << 16)


def json_object(data: str | bytes) -> dict[str, Any] | None:
    """`data` parsed as JSON where it is a JSON object within FROM_SERVER_JSON; None for
    anything else."""
    try:
        message = read_json(data, FROM_SERVER_JSON)
    except ProtocolError:
        return None
    return message if isinstance(message, dict) else None


class SignalingClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        on_message: Callable[[dict[str, Any]], None] | None = None,
        relay_only: bool = False,
    ) -> None:
        self.url = signaling_url(url)
        # ICE through the session's TURN servers only (a page's iceTransportPolicy "relay")
        self.relay_only = relay_only
        self.token = token
        self.on_message = on_message
        self.errors: list[dict[str, Any]] = []  # error messages from the server
        self.info: dict[str, Any] = {}  # the `session.started` message
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._started: asyncio.Future[dict[str, Any]] | None = None
        self._answer: asyncio.Future[str] | None = None
        self.ended: asyncio.Future[str] | None = None  # the reason of `session.ended`
        self.closed = asyncio.Event()  # the socket is gone

    async def start(
        self, timeout: float | None = 15.0, resume: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        """Open the socket and start a session, or with `resume` (session id, resume token)
        take one over as a reloaded page does; the `session.started` message.

        aiohttp's errors (a refused upgrade, an unreachable server) pass through;
        SignalingError when the server says no."""
        if resume is None:
            first: dict[str, Any] = {"type": "session.start"}
        else:
            session_id, resume_token = resume
            first = {"type": "session.resume", "sessionId": session_id, "resumeToken": resume_token}
        return await self._open(first, timeout)

    async def watch(
        self, share_token: str, name: str | None = None, timeout: float | None = 15.0
    ) -> dict[str, Any]:
        """Open the socket with a share link's token and watch its session (docs/sharing.md);
        the `session.watching` message. Then `negotiate` as a controller does; a
        `viewer.ended` fails what waits (SignalingError with its code) and sets `ended`."""
        self.token = share_token
        watch = {"type": "session.watch", "token": share_token}
        return await self._open(watch if name is None else {**watch, "name": name}, timeout)

    async def _open(self, first: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        self._started, self._answer, self.ended = (
            loop.create_future(), loop.create_future(), loop.create_future()
        )  # fmt: skip
        self._http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._ws = await self._http.ws_connect(self.url, headers=headers)
        self._reader = asyncio.create_task(self._read())
        await self.send(first)
        async with asyncio.timeout(timeout):
            self.info = await asyncio.shield(self._started)
        return self.info

    def peer_connection(self) -> RTCPeerConnection:
        """A peer connection with the session's ICE servers (TURN ones with their credentials),
        relayed only where `relay_only` says so."""
        ice = [
            RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
            for s in self.info.get("iceServers", [])
        ]
        policy = RTCIceTransportPolicy.RELAY if self.relay_only else RTCIceTransportPolicy.ALL
        return RTCPeerConnection(RTCConfiguration(iceServers=ice, iceTransportPolicy=policy))

    def viewer_peer(
        self,
        on_message: Callable[[str | bytes], None],
        on_open: Callable[[], None],
        codec: str = "H264",
        transport_feedback: bool = True,
    ) -> tuple[RTCPeerConnection, RTCRtpReceiver, RTCDataChannel]:
        """A peer connection as the page opens one, ready to `negotiate`: a recvonly video
        transceiver that offers `codec` only (as the SDK's `codecs` option does; aiortc would
        put VP8 first), then the `input` data channel, whose messages go to `on_message`. Like
        Chromium it offers the playout-delay extension, so the worker sends what it would send
        a browser (the extension on every packet), and like a browser its receiver sends
        transport-cc feedback, which the worker's congestion controller runs on (unless not
        `transport_feedback`: the worker then follows aiortc's REMB), and acknowledges the
        channel's messages as a browser's SCTP does: every second packet, or within 200 ms
        (`delay_sacks`), not each at once as aiortc would."""
        register_playout_delay()
        pc = self.peer_connection()
        transceiver = pc.addTransceiver("video", direction="recvonly")
        if transport_feedback:
            send_transport_feedback(transceiver.receiver)
        transceiver.setCodecPreferences(codec_preferences(codec))
        channel = pc.createDataChannel("input")
        assert pc.sctp is not None  # aiortc makes the association with the first channel
        delay_sacks(pc.sctp)
        channel.on("open", on_open)
        channel.on("message", on_message)
        return pc, transceiver.receiver, channel

    async def negotiate(
        self,
        pc: RTCPeerConnection,
        timeout: float | None = 15.0,
        edit_offer: Callable[[str], str] | None = None,
    ) -> None:
        """Offer `pc`'s local description, wait for the worker's answer and apply it.
        ConnectionError where a relay-only peer gathered no relayed candidate."""
        assert self._answer is not None, "start() first"
        await pc.setLocalDescription(await pc.createOffer())  # aiortc: gathered by now
        sdp = pc.localDescription.sdp
        if self.relay_only and "a=candidate:" not in sdp:
            raise ConnectionError(
                "no media path: no relayed candidate (relay only: the TURN servers gave no "
                "allocation; wrong credentials, or none reachable)"
            )
        await self.send({"type": "offer", "sdp": edit_offer(sdp) if edit_offer else sdp})
        async with asyncio.timeout(timeout):
            answer = await asyncio.shield(self._answer)
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    async def send(self, message: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send_str(json.dumps({"v": PROTOCOL_VERSION, **message}))

    async def end(self, timeout: float | None = None) -> str | None:
        """Send `session.end`; with a timeout, wait that long for `session.ended` (so that
        every frame the worker counted has arrived) and return its reason. None at once when
        the message cannot be sent (the socket is gone: no answer will come)."""
        try:
            await self.send({"type": "session.end"})
        except Exception:
            return None
        if timeout is None or self.ended is None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                return await asyncio.shield(self.ended)
        return None

    async def hang_up(self, pc: RTCPeerConnection | None) -> None:
        """End the session without waiting for the answer, close `pc`, then the socket."""
        await self.end()
        if pc is not None:
            await pc.close()
        await self.close()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()
        self.closed.set()

    async def _read(self) -> None:
        assert self._ws is not None
        try:
            async for msg in self._ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                message = json_object(msg.data)
                if message is not None:
                    self._dispatch(message)
        finally:
            self.closed.set()
            self._fail_waiters(SignalingError("closed", "the signaling socket closed"))

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        assert self._started is not None and self._answer is not None and self.ended is not None
        if kind in ("session.started", "session.watching") and not self._started.done():
            self._started.set_result(message)
        elif kind == "answer" and not self._answer.done():
            self._answer.set_result(str(message.get("sdp", "")))
        else:
            if kind == "error":
                self.errors.append(message)
                if self._fail_waiters(
                    SignalingError(str(message.get("code")), str(message.get("message")))
                ):
                    return
            elif kind == "session.ended":
                if not self.ended.done():
                    self.ended.set_result(str(message.get("reason", "")))
                self._fail_waiters(
                    SignalingError("ended", f"the session ended ({message.get('reason')})")
                )
            elif kind == "viewer.ended":  # a viewer's stream ended, or was refused
                code = str(message.get("code", ""))
                if not self.ended.done():
                    self.ended.set_result(code)
                self._fail_waiters(SignalingError(code, str(message.get("message"))))
            if self.on_message is not None:
                self.on_message(message)

    def _fail_waiters(self, error: SignalingError) -> bool:
        """Fail the first handshake step still waiting; True if there was one."""
        for waiter in (self._started, self._answer):
            if waiter is not None and not waiter.done():
                waiter.set_exception(error)
                waiter.exception()  # retrieved: nobody may be awaiting it yet
                return True
        return False
