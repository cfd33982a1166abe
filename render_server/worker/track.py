"""A video track that hands aiortc already-encoded packets, paced at the stream's frame rate."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from ..render.camera import OrbitCamera
from .pipeline import FramePipeline

RTP_CLOCK = 90_000


class EncodedVideoTrack(MediaStreamTrack):
    """`recv()` returns one `av.Packet` per frame tick; aiortc only packetizes it.

    Ticks that were missed (a slow frame) are dropped rather than queued: the next frame shows
    the newest camera, never a backlog.
    """

    kind = "video"

    def __init__(
        self,
        pipeline: FramePipeline,
        fps: float,
        camera_source: Callable[[float], OrbitCamera],
        executor: Executor,
        on_frame: Callable[[av.Packet], None] | None = None,
    ) -> None:
        super().__init__()
        self._pipeline = pipeline
        self._interval = 1.0 / fps
        self._camera_source = camera_source
        self._executor = executor
        self._on_frame = on_frame
        self._next_tick: float | None = None
        self._last_frame: float | None = None
        self._t0 = time.monotonic()
        self.dropped_ticks = 0  # frame times skipped because a frame took too long

    def set_fps(self, fps: float) -> None:
        """Pace frames at `fps` from the next tick on."""
        self._interval = 1.0 / fps

    async def recv(self) -> av.Packet:
        loop = asyncio.get_running_loop()
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            now = loop.time()
            if self._next_tick is None:
                self._next_tick = now
            wait = self._next_tick - now
            if wait > 0:
                await asyncio.sleep(wait)
            elif -wait > self._interval:
                missed = int(-wait / self._interval)
                self.dropped_ticks += missed
                self._next_tick += missed * self._interval
            self._next_tick += self._interval

            now = time.monotonic()
            dt = 0.0 if self._last_frame is None else now - self._last_frame
            self._last_frame = now
            camera = self._camera_source(dt)
            pts = int((now - self._t0) * RTP_CLOCK)
            packet = await loop.run_in_executor(self._executor, self._pipeline.produce, camera, pts)
            if self.readyState != "live":
                raise MediaStreamError
            if packet is not None:
                if self._on_frame is not None:
                    self._on_frame(packet)
                return packet
