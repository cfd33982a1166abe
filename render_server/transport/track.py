"""A video track that hands aiortc already-encoded packets, paced at the stream's frame rate.

Checked against aiortc 1.16: a track whose `recv()` returns an `av.Packet` takes aiortc's
pre-encoded path (`RTCRtpSender._next_encoded_frame` packs it with the codec's `pack`, never
encoding); keyframe requests never reach that path, `rtcp_feedback` routes them to our encoder.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Generic, Protocol, TypeVar

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from render_server.encode.protocol import EncodedPacket
from render_server.protocol.timing import now_ms
from render_server.ticks import on_grid

RTP_CLOCK = 90_000
# In a long move each frame waits out the frame-rate cap, and the event loop wakes it late
# (epoll's timeout is rounded up to the next millisecond, the VM adds its own, and a loaded
# worker serves every session's frame of a tick in turn). Counted from each late start, every
# frame pushed all later ones back: a 30 fps drag held 29.1 fps, 60 fps 57.2. With up to 2 ms
# forgiven, 20 × 4K30 on one process still held 28.3-29.7 fps, its later frames of a tick
# starting up to 15 ms late. So the cap counts from when the frame was due, forgiving lateness
# up to this fraction of the frame interval: the rate holds, and two new frames are never
# closer than half an interval (a browser's jitter buffer evens that out).
WAKE_SLACK = 0.5

Camera = TypeVar("Camera")
Camera_contra = TypeVar("Camera_contra", contravariant=True)


class FrameSource(Protocol[Camera_contra]):
    """What the track draws frames from: a session's pipeline (stream/pipeline.py)."""

    @property
    def cheap(self) -> bool:
        """Frames cost next to nothing: produce them on the event loop, not on a thread."""
        ...

    def is_still(self, camera: Camera_contra) -> bool:
        """The next frame would repeat the last picture with nothing else to do."""
        ...

    def produce(self, camera: Camera_contra, pts: int) -> EncodedPacket | None:
        """The encoded frame of `camera` (on the session's thread unless `cheap`)."""
        ...


class EncodedVideoTrack(MediaStreamTrack, Generic[Camera]):
    """`recv()` returns one `av.Packet` per frame; aiortc only packetizes it.

    Frames follow the stream's frame rate, on ticks at multiples of the frame interval of the
    event loop's clock, where every session's track at that rate ticks (`ticks`). Ticks that
    were missed (a slow frame) are dropped rather than queued: the next frame shows the newest
    camera, never a backlog. While the
    picture stands still, frames repeat at `idle_fps` only (half the frame rate unless given).
    Input (`poke`) starts a frame at once instead of waiting for a tick: the frame-rate cap
    holds between frames that show something new, so the first move after stillness never
    waits behind a repeat, and input that arrives while a frame is being made starts the next
    one as soon as that frame is handed over. A frame that fails is `on_error`'s to judge:
    True, the track goes on at the next tick; False, it ends. A `pause`d track renders and
    encodes nothing (its peer went quiet) until `resume`, then ticks from that moment.
    """

    kind = "video"

    def __init__(
        self,
        pipeline: FrameSource[Camera],
        fps: float,
        camera_source: Callable[[float], Camera],
        executor: Executor,
        on_frame: Callable[[EncodedPacket, float], None] | None = None,
        idle_fps: float | None = None,
        on_error: Callable[[Exception], bool] | None = None,
    ) -> None:
        super().__init__()
        self._on_error = on_error
        self._pipeline = pipeline
        self._camera_source = camera_source
        self._executor = executor
        self._on_frame = on_frame
        self._idle_fps = idle_fps
        self._interval = self._idle_interval = self._wake_slack = 0.0
        self.set_fps(fps)
        self._next_tick: float | None = None
        self._last_camera: float | None = None
        self._last_sent = -float("inf")  # loop time of the last frame's start
        self._last_new = -float("inf")  # ... and when the last new one was due (WAKE_SLACK)
        self._input_pending = False  # input came while no tick was awaited
        self._waiter: asyncio.Future[bool] | None = None
        self._t0 = time.monotonic()
        self.dropped_ticks = 0  # frame times skipped because a frame took too long
        self.idle_ticks = 0  # ticks that repeated nothing because the picture stood still
        self.ticks = 0  # frame times taken (sent or idle); dropped ones are counted above
        self._running = asyncio.Event()
        self._running.set()  # cleared while paused

    def set_fps(self, fps: float) -> None:
        """Pace frames at `fps` from the next tick on."""
        self._interval = 1.0 / fps
        self._wake_slack = self._interval * WAKE_SLACK
        # half the rate by default: a gap under three frame intervals is no freeze to a browser
        idle = min(self._idle_fps or fps / 2, fps)
        self._idle_interval = 1.0 / idle

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        """Make no frame until `resume`: nobody is there to see it."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        super().stop()
        self._running.set()  # a paused `recv` wakes to find the track ended

    def poke(self) -> None:
        """Input arrived: a frame should start as soon as the frame rate allows."""
        if self._waiter is not None:
            _settle(self._waiter, True)
        else:
            self._input_pending = True  # a frame is being made: the next one starts at once

    async def _wait(self, seconds: float) -> bool:
        """Sleep `seconds`, or less if poked; True when poked. (A future and a timer: cheaper
        per frame than `wait_for`, which makes a task each time.)"""
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiter = waiter
        timer = loop.call_later(seconds, _settle, waiter, False)
        try:
            return bool(await waiter)
        finally:
            timer.cancel()
            self._waiter = None

    async def recv(self) -> EncodedPacket:
        loop = asyncio.get_running_loop()
        while True:
            if not self._running.is_set():
                await self._running.wait()
                self._next_tick = None  # ticks start again from the resume, not a backlog
            if self.readyState != "live":
                raise MediaStreamError
            now = loop.time()
            if self._next_tick is None:
                self._next_tick = now
            wait = self._next_tick - now
            poked, self._input_pending = self._input_pending, False
            if wait > 0 and (poked or await self._wait(wait)):
                # input: start now if the frame rate allows (a repeat does not count), and
                # count ticks from here
                earliest = self._last_new + self._interval
                if loop.time() < earliest:
                    await asyncio.sleep(earliest - loop.time())
                self._next_tick = loop.time() + self._interval
            else:
                if -wait > self._interval:
                    missed = int(-wait / self._interval)
                    self.dropped_ticks += missed
                    self._next_tick += missed * self._interval
                # a tick of the clock: the next one on the process's grid of this frame rate,
                # where every other session's track at the rate ticks too (`ticks`)
                self._next_tick = on_grid(self._next_tick + self._interval, self._interval)

            self.ticks += 1
            now = time.monotonic()
            dt = 0.0 if self._last_camera is None else now - self._last_camera
            self._last_camera = now
            camera = self._camera_source(dt)
            started = loop.time()
            # half a tick of slack: ticks are not exact, and a repeat is due on its tick
            idle_due = self._last_sent + self._idle_interval - self._interval / 2
            still = self._pipeline.is_still(camera)
            if started < idle_due and still:
                self.idle_ticks += 1
                continue
            self._last_sent = started
            if not still:
                due = self._last_new + self._interval  # in a move, when this frame was due
                if started - due > self._interval:  # no move under way: the cap counts from now
                    self._last_new = started
                else:
                    self._last_new = max(due, started - self._wake_slack)
            pts = int((now - self._t0) * RTP_CLOCK)
            try:
                if self._pipeline.cheap:
                    packet = self._pipeline.produce(camera, pts)  # a thread hop would cost more
                else:
                    packet = await loop.run_in_executor(
                        self._executor, self._pipeline.produce, camera, pts
                    )
            except Exception as exc:
                # raised into aiortc, it would stop the track: a frozen picture on a session
                # that looks healthy. `on_error` says whether to go on (at the next tick).
                if self._on_error is None:
                    raise
                if self._on_error(exc) and self.readyState == "live":
                    continue
                self.stop()
                raise MediaStreamError from exc
            if self.readyState != "live":
                raise MediaStreamError
            if packet is not None:
                if self._on_frame is not None:
                    self._on_frame(packet, now_ms())
                return packet


def _settle(waiter: asyncio.Future[bool], poked: bool) -> None:
    if not waiter.done():
        waiter.set_result(poked)
