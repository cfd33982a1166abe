"""A measuring client: one session through the signaling API, driven and timed from Python.

It opens a session the way `viewer.Viewer` does, observes the video on the RTP marker bit (no
decoding in aiortc; keyframes or every frame decoded by a `FrameDecoder` of its own), keeps
the clocks aligned with pings, drags the camera at a steady rate with numbered pointer moves, and
matches the worker's `timing` records with what arrived.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiortc import RTCPeerConnection

from render_server.protocol.timing import now_ms  # the client clock, as frames' arrival times are
from render_server.tools.measure.clock import ping_burst, ping_every
from render_server.tools.measure.frames import (
    DecodeMode,
    FrameAssembler,
    FrameDecoder,
    ObservedFrame,
)
from render_server.tools.measure.latency import LatencyMatcher
from render_server.tools.signaling_client import SignalingClient, SignalingError
from render_server.transport.receiver_hook import observe_receiver


class MeasureError(RuntimeError):
    """The session could not be opened or gave nothing to measure."""


__all__ = ["LatencyClient", "MeasureError", "measure_latency"]


class LatencyClient:
    """Measures one session. `codec`: the one video codec offered (H264, VP8, AV1); frames are
    read in whichever the answer names. `decode`: which frames a `FrameDecoder` decodes
    ("none", "keyframes", "all"); aiortc's own decoder never runs. `input_rate`: numbered
    pointer moves per second; the drag turns back every `swing` seconds so the camera keeps
    moving."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        decode: DecodeMode = "keyframes",
        input_rate: float = 20.0,
        ping_interval: float = 1.0,
        swing: float = 1.0,
        codec: str = "H264",
        relay_only: bool = False,
    ) -> None:
        self.signaling = SignalingClient(url, token, relay_only=relay_only)
        self.codec = codec
        self.input_rate = input_rate
        self.ping_interval = ping_interval
        self.swing = swing
        self.matcher = LatencyMatcher()
        self.decoder = FrameDecoder(decode) if decode != "none" else None
        self.assembler = FrameAssembler(
            self._on_frame, keep_payload=self.decoder is not None, codec=codec
        )
        self.errors = self.signaling.errors  # the server's and the worker's error messages
        self.session_info: dict[str, Any] = {}
        self.pc: RTCPeerConnection | None = None
        self._channel_open = asyncio.Event()
        self._first_frame = asyncio.Event()
        self._seq = 0

    # -- the session -----------------------------------------------------------------------

    async def start(self, timeout: float = 20.0) -> None:
        """Open a session, negotiate, and wait for the channel and the first frame."""
        try:
            self.session_info = await self.signaling.start(timeout)
            self.pc, receiver, self.channel = self.signaling.viewer_peer(
                self._on_message, self._channel_open.set, codec=self.codec
            )
            observe_receiver(receiver, self.assembler.add, on_codec=self.assembler.set_codec)
            await self.signaling.negotiate(self.pc, timeout)
        except SignalingError as exc:
            raise MeasureError(str(exc)) from None
        async with asyncio.timeout(timeout):
            await self._channel_open.wait()
        async with asyncio.timeout(timeout):
            await self._first_frame.wait()

    async def measure(self, seconds: float, settle: float = 0.5) -> dict[str, Any]:
        """Ping and drag for `seconds`, then wait `settle` seconds for the last records."""
        clock = self.matcher.clock
        await ping_burst(self.send, clock)
        pinger = asyncio.create_task(ping_every(self.send, clock, self.ping_interval))
        try:
            await self._drag(seconds)
            await asyncio.sleep(settle)
        finally:
            pinger.cancel()
        return self.report()

    def report(self) -> dict[str, Any]:
        if not self.matcher.clock.samples:
            raise MeasureError("the worker answered no ping: it does not speak the timing protocol")
        if not self.matcher.records:
            raise MeasureError("the worker sent no timing record")
        report = self.matcher.report()
        stats = self.assembler.stats
        report["codec"] = self.assembler.format.codec
        report["packets"] = {
            "received": stats.packets,
            "duplicates": stats.duplicates,
            "late": stats.late,
            "malformed_frames": stats.malformed,  # complete, but not in the codec's format
        }
        if self.decoder is not None:
            report["decode"] = {"mode": self.decoder.mode, **self.decoder.stats.as_dict()}
        report["worker_errors"] = self.errors
        return report

    async def close(self) -> None:
        await self.signaling.hang_up(self.pc)
        if self.decoder is not None:
            await asyncio.to_thread(self.decoder.close)

    async def __aenter__(self) -> LatencyClient:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- what it sends ---------------------------------------------------------------------

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def _drag(self, seconds: float) -> None:
        """A left-button drag across the middle, numbered moves at `input_rate`, turning back
        every `swing` seconds."""
        self.send({"type": "pointer", "action": "down", "x": 0.5, "y": 0.5, "buttons": 1})
        period = 1.0 / self.input_rate
        start = time.monotonic()
        tick = 0
        try:
            while (elapsed := time.monotonic() - start) < seconds:
                direction = 1 if int(elapsed / self.swing) % 2 == 0 else -1
                self._seq += 1
                self.matcher.input_sent(self._seq, now_ms())
                self.send(
                    {
                        "type": "pointer",
                        "action": "move",
                        "x": 0.5,
                        "y": 0.5,
                        "dx": 0.01 * direction,
                        "dy": 0.0,
                        "buttons": 1,
                        "seq": self._seq,
                    }
                )
                tick += 1
                await asyncio.sleep(max(0.0, start + tick * period - time.monotonic()))
        finally:
            self.send({"type": "pointer", "action": "up", "x": 0.5, "y": 0.5, "buttons": 0})

    # -- what it receives ------------------------------------------------------------------

    def _on_frame(self, frame: ObservedFrame, access_unit: bytes) -> None:
        self.matcher.add_frame(frame)
        if self.decoder is not None:
            self.decoder.offer(frame, access_unit)
        self._first_frame.set()

    def _on_message(self, data: str | bytes) -> None:
        message = self.matcher.receive(data)  # timing records and pongs stop there
        if message is not None and message.get("type") == "error":
            self.errors.append(message)


async def measure_latency(
    url: str,
    seconds: float = 10.0,
    token: str | None = None,
    decode: DecodeMode = "keyframes",
    codec: str = "H264",
    relay_only: bool = False,
) -> dict[str, Any]:
    """Open a session on `url` that asks for `codec` (through TURN only with `relay_only`),
    measure for `seconds`, close it; the report (its `codec`: the one that came)."""
    async with LatencyClient(url, token, decode, codec=codec, relay_only=relay_only) as client:
        return await client.measure(seconds)
