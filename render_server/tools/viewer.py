"""A Python viewer: asks the signaling server for a session and receives the stream with aiortc.

Used by the tests. Frames arrive decoded by aiortc's receiver (which holds each frame until the
next one starts: fine for checking the picture, not for latency figures; `measure` times them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import av
from aiortc import RTCPeerConnection, RTCRtpReceiver
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RTCP_PSFB_APP, RtcpPsfbPacket, pack_remb_fci

from render_server.tools.signaling_client import SignalingClient, json_object


class Viewer:
    """One stream into Python. `receiver_estimates=False` leaves abs-send-time out of the offer,
    so aiortc's receiver sends no REMB of its own (tests then send the only ones)."""

    def __init__(
        self,
        url: str,
        frame_queue: int = 8,
        receiver_estimates: bool = True,
        token: str | None = None,
        resume: tuple[str, str] | None = None,
    ) -> None:
        """`resume`: (session id, resume token) of a session to take over instead of starting
        one, as a page that reloads does."""
        self.url = url
        self.token = token
        self.resume = resume
        self.receiver_estimates = receiver_estimates
        self.session_info: dict[str, Any] = {}
        self.frames: asyncio.Queue[av.VideoFrame] = asyncio.Queue(frame_queue)
        self.messages: list[dict[str, Any]] = []  # everything the worker sent on the channel
        self._message_arrived = asyncio.Event()
        self.signaling = SignalingClient(url, token)
        self.errors = self.signaling.errors  # the server's and the worker's error messages
        self.pc: RTCPeerConnection | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._channel_open = asyncio.Event()

    async def start(self, timeout: float = 15.0) -> dict[str, Any]:
        """Start a session and negotiate; returns the `session.started` message."""
        self.session_info = await self.signaling.start(timeout, self.resume)
        self.pc, _, self.input = self.signaling.viewer_peer(
            self._on_worker_message, self._channel_open.set
        )
        self.pc.on("track", self._on_track)
        # without abs-send-time aiortc's receiver makes no bandwidth estimates (no REMB)
        edit = None if self.receiver_estimates else _without_abs_send_time
        await self.signaling.negotiate(self.pc, timeout, edit_offer=edit)
        return self.session_info

    async def next_frame(self, timeout: float = 10.0) -> av.VideoFrame:
        async with asyncio.timeout(timeout):
            return await self.frames.get()

    async def latest_frame(self, settle: float = 0.3, timeout: float = 10.0) -> av.VideoFrame:
        """The newest frame after `settle` seconds: what the picture looks like now."""
        await asyncio.sleep(settle)
        frame = await self.next_frame(timeout)
        while not self.frames.empty():
            frame = self.frames.get_nowait()
        return frame

    async def send_input(self, event: dict[str, Any]) -> None:
        async with asyncio.timeout(10.0):
            await self._channel_open.wait()
        self.input.send(json.dumps(event))

    async def send_raw_input(self, data: str) -> None:
        async with asyncio.timeout(10.0):
            await self._channel_open.wait()
        self.input.send(data)

    async def wait_message(
        self, type: str, start: int = 0, timeout: float = 10.0, **fields: Any
    ) -> dict[str, Any]:
        """The first data-channel message from the worker, from index `start` of `messages`
        on, of `type` and with the given field values; waits up to `timeout` seconds for it."""

        async def find() -> dict[str, Any]:
            seen = start
            while True:
                for message in self.messages[seen:]:
                    if message.get("type") == type and all(
                        message.get(k) == v for k, v in fields.items()
                    ):
                        return message
                seen = max(seen, len(self.messages))
                self._message_arrived.clear()
                await self._message_arrived.wait()

        async with asyncio.timeout(timeout):
            return await find()

    async def request_keyframe(self) -> None:
        """Send a real RTCP PLI for the video stream, as a browser does after loss."""
        receiver, ssrc = self._video_source("nothing to ask a keyframe of")
        await receiver._send_rtcp_pli(ssrc)

    async def send_remb(self, bitrate: int) -> None:
        """Send a receiver estimated maximum bitrate (RTCP REMB) for the video stream."""
        receiver, ssrc = self._video_source("no stream to estimate")
        packet = RtcpPsfbPacket(
            fmt=RTCP_PSFB_APP, ssrc=0, media_ssrc=0, fci=pack_remb_fci(bitrate, [ssrc])
        )
        await receiver._send_rtcp(packet)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.signaling.hang_up(self.pc)

    async def drop(self) -> None:
        """Drop the peer connection and the socket but not the session, as a page that reloads
        does: the session waits for a `resume` within the server's grace period."""
        for task in self._tasks:
            task.cancel()
        if self.pc is not None:
            await self.pc.close()
        await self.signaling.close()

    async def __aenter__(self) -> Viewer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- internals -------------------------------------------------------------------------

    @property
    def ended(self) -> asyncio.Future[str] | None:
        """The reason of `session.ended`, once the server sends it."""
        return self.signaling.ended

    def _video_source(self, no_packet_yet: str) -> tuple[RTCRtpReceiver, int]:
        """The video receiver and the SSRC of its stream; RuntimeError before its first packet."""
        assert self.pc is not None
        receiver = next(t.receiver for t in self.pc.getTransceivers() if t.kind == "video")
        ssrcs = [s.source for s in receiver.getSynchronizationSources()]
        if not ssrcs:
            raise RuntimeError(f"no video packet received yet: {no_packet_yet}")
        return receiver, ssrcs[0]

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.create_task(self._read_frames(track)))

    async def _read_frames(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if self.frames.full():  # keep the newest frames, never block the receiver
                    self.frames.get_nowait()
                self.frames.put_nowait(frame)  # type: ignore[arg-type]

    def _on_worker_message(self, data: str | bytes) -> None:
        message = json_object(data)
        if message is None:
            return
        self.messages.append(message)
        self._message_arrived.set()
        if message.get("type") == "error":
            self.errors.append(message)


def _without_abs_send_time(sdp: str) -> str:
    return "".join(line for line in sdp.splitlines(keepends=True) if "abs-send-time" not in line)
