"""One viewer's video track: the owner's encoded frames, handed on as they are, never re-encoded.

A shared session encodes each frame once (stream/viewers.py). The session hands every encoded
packet to each viewer's `FanOutTrack` (`push`, which never waits); the viewer's aiortc sender
takes them from `recv()` on its pre-encoded path. Checked against aiortc 1.16: the codecs'
`pack` (H.264, VP8, and ours for AV1) only read the packet (`bytes(packet)`, `pts`,
`time_base`), and each sender adds its own RTP timestamp origin and sequence numbers: the same
`av.Packet` object goes to every sender unchanged.

A queue of a few frames per viewer takes up jitter of its event-loop turn. A viewer that does
not keep up loses frames, its own only: the frame that finds its queue full and every one after
it until a keyframe, since a decoder cannot go on from a gap. It asks for that keyframe, at most
once per `KEYFRAME_EVERY_S`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from aiortc import RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from render_server.encode.protocol import EncodedPacket

QUEUE_FRAMES: Final = 3  # a viewer this far behind is dropping, not catching up
KEYFRAME_EVERY_S: Final = 1.0  # one viewer's keyframe requests, at most


class FanOutTrack(MediaStreamTrack):
    """Frames pushed by the session, to one viewer's sender.

    `request_keyframe` asks the session's pipeline for a keyframe (rate-limited here, per
    viewer); `on_frame(sent)` counts each frame sent (True) or dropped (False).
    """

    kind = "video"

    def __init__(
        self,
        request_keyframe: Callable[[], None],
        on_frame: Callable[[bool], None] | None = None,
        queue_frames: int = QUEUE_FRAMES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._request_keyframe = request_keyframe
        self._on_frame = on_frame
        self._queue: deque[EncodedPacket] = deque()
        self._limit = queue_frames
        self._clock = clock
        self._waiter: asyncio.Future[None] | None = None
        self._reading = False  # the sender asked for a frame: its transport is connected
        self._need_keyframe = True  # a decoder starts from one: the first, and after a gap
        self._behind = False  # the keyframe awaited is for frames dropped (not the first one)
        self._asked_at = -float("inf")
        self.sent = 0
        self.dropped = 0  # frames lost to a full queue (the wait for the first keyframe aside)

    def push(self, packet: EncodedPacket, keyframe: bool) -> None:
        """The session's next encoded frame; never waits, never raises into the session."""
        if self.readyState != "live" or not self._reading:
            return  # not connected yet: its first frame will be a keyframe it asks for then
        if self._need_keyframe and not keyframe:
            if self._behind:
                self._drop()
            self.ask_keyframe()  # again after KEYFRAME_EVERY_S, should one be lost
            return
        if keyframe:
            self._queue.clear()  # older frames are nothing a decoder needs now
            self._need_keyframe = self._behind = False
        elif len(self._queue) >= self._limit:
            self._need_keyframe = self._behind = True
            self._drop()
            self.ask_keyframe()
            return
        self._queue.append(packet)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def recv(self) -> EncodedPacket:
        if not self._reading:
            self._reading = True
            self.ask_keyframe()
        while not self._queue:
            if self.readyState != "live":
                raise MediaStreamError
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self.readyState != "live":
            raise MediaStreamError
        self.sent += 1
        if self._on_frame is not None:
            self._on_frame(True)
        return self._queue.popleft()

    def stop(self) -> None:
        super().stop()
        self._queue.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # recv() raises MediaStreamError: the sender's loop ends

    def _drop(self) -> None:
        self.dropped += 1
        if self._on_frame is not None:
            self._on_frame(False)

    def ask_keyframe(self) -> None:
        """Ask the pipeline for a keyframe, unless this viewer did less than
        KEYFRAME_EVERY_S ago (its PLIs, its page's `keyframe`, its own gaps)."""
        now = self._clock()
        if now - self._asked_at >= KEYFRAME_EVERY_S:
            self._asked_at = now
            self._request_keyframe()


def watch_rtcp(sender: RTCRtpSender, on_rtcp: Callable[[], None]) -> None:
    """Call `on_rtcp` for each RTCP packet the peer sends about `sender` (a receiver report,
    a PLI, a NACK): whether its peer is still there. Wraps the sender instance's private
    `_handle_rtcp_packet` (aiortc 1.16), over `rtcp_feedback`'s wrapper where it is one."""
    handle = getattr(sender, "_handle_rtcp_packet", None)
    if not callable(handle):
        raise RuntimeError("this aiortc's RTCRtpSender has no RTCP hook to watch")

    async def heard(packet: Any) -> None:
        on_rtcp()
        await handle(packet)

    sender._handle_rtcp_packet = heard  # type: ignore[method-assign]
