"""One load-test stream: a real session through the signaling API, watched packet by packet.

A `StreamProbe` is what a browser would be, minus the decoder: it asks for a session on `/ws`,
negotiates a recvonly video transceiver and the `input` data channel with aiortc (ICE, DTLS,
SRTP), asks for the size and rate under test with a `quality` message, and then counts what
arrives. Frames are assembled on the RTP marker bit (`measure.frames`), aiortc's decoder never
runs, and a keyframe is decoded now and then on a thread to prove the stream is real video of
the size asked for. The worker's `timing` records, matched by RTP timestamp and put on this
clock by ping/pong, give each frame's latency: its start on the worker to its last packet in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from aiortc import RTCPeerConnection
from aiortc.rtcrtpreceiver import RTCRtpReceiver

from render_server.protocol.timing import now_ms  # one clock for all the runner's processes
from render_server.tools.loadtest.config import LoadTestConfig
from render_server.tools.loadtest.decoding import StreamDecoder, pick_decoder
from render_server.tools.loadtest.drag import drag
from render_server.tools.loadtest.frame_latency import FrameLatencies
from render_server.tools.loadtest.result import StreamResult
from render_server.tools.loadtest.sampling import KeyframeSampler, SamplingAssembler
from render_server.tools.measure.clock import ping_burst, ping_every
from render_server.tools.measure.frames import FrameAssembler, ObservedFrame
from render_server.tools.signaling_client import SignalingClient, SignalingError
from render_server.transport.counting_receiver import CountingReceiver
from render_server.transport.feedback_generator import (
    TransportFeedbackHandle,
    send_transport_feedback,
)
from render_server.transport.lean_receiver import LeanReceiver
from render_server.transport.receiver_hook import observe_receiver

FREEZE_INTERVALS = 3  # a gap longer than this many frame intervals between frames is a freeze
PING_INTERVAL_S = 1.0
END_WAIT_S = 5.0  # after session.end, how long the worker has to answer session.ended
PEER_CLOSED_GRACE_S = 1.0
MAX_FREEZE_EVENTS = 100
MAX_WORKER_ERRORS = 20  # error messages kept, from the signaling and the data channel


class StreamFailed(Exception):
    """Ends a stream early; the message is the reason the report gives."""


class StreamProbe:
    """Runs one stream of a load test from its start time to the run's end."""

    def __init__(self, config: LoadTestConfig, index: int, process: int, t0_ms: float) -> None:
        self.config = config
        self.t0_ms = t0_ms
        self.result = StreamResult(index, process)
        self._lean: LeanReceiver | None = None
        self._feedback: TransportFeedbackHandle | None = None
        self.latency = FrameLatencies()  # also takes the pongs: its clock is the stream's
        self.interval_ms = 1000.0 / config.fps
        self.decoder: StreamDecoder | None = None
        mode = config.decode_mode
        if mode != "none":
            self.decoder = StreamDecoder(mode, *pick_decoder(config.decoder, config.codec))
        self._sampler: KeyframeSampler | None = None  # the counting receiver's
        if mode == "keyframes" and config.receiver == "count":
            self._sampler = KeyframeSampler(self._on_sampled, config.decode_every, config.codec)
        if mode == "keyframes":
            self.assembler: FrameAssembler = SamplingAssembler(self._on_frame, config.decode_every)
        else:  # "all" needs every frame's bytes
            self.assembler = FrameAssembler(self._on_frame, keep_payload=mode == "all")
        self.assembler.set_codec(config.codec)  # until the first packet says which came
        self.pc: RTCPeerConnection | None = None
        self.signaling = SignalingClient(config.server, config.token, on_message=self._on_signal)
        self._watcher: asyncio.Task[None] | None = None
        self._channel: Any = None
        self._closing = False
        self._stopped = asyncio.Event()  # the stream failed or the worker ended it
        self._first_frame = asyncio.Event()
        self._last_frame_ms: float | None = None

    # -- the run -----------------------------------------------------------------------------

    @property
    def packets(self) -> int:
        """The media's RTP packets received so far, each once: not the copies a bandwidth
        probe's padding repeats (RTX of recent packets, under transport-cc), nor repeats."""
        if isinstance(self._lean, CountingReceiver):  # the assembler sees no packet
            return self._lean.stats.packets
        stats = self.assembler.stats
        return stats.packets - stats.duplicates - stats.late

    def _rel_s(self, ms: float) -> float:
        return round((ms - self.t0_ms) / 1000.0, 4)

    async def run(self) -> StreamResult:
        """From this stream's start on the ramp to the end of the hold; never raises."""
        config = self.config
        start_ms = self.t0_ms + config.start_offset_s(self.result.index) * 1000.0
        end_ms = self.t0_ms + config.end_s * 1000.0
        await asyncio.sleep(max(0.0, (start_ms - now_ms()) / 1000.0))
        self.result.requested_s = self._rel_s(now_ms())
        try:
            async with asyncio.timeout(config.setup_timeout_s):
                await self._open_by(end_ms)
        except StreamFailed as exc:
            self._fail(str(exc))
        except TimeoutError:
            queued = self.result.state == "queued"
            where = f" (queued at position {self.result.queued_position})" if queued else ""
            self._fail(f"no frame within {config.setup_timeout_s:g} s of the request{where}")
        except (aiohttp.ClientError, OSError) as exc:
            self._fail(f"signaling unreachable: {exc}")
        except Exception as exc:  # aiortc's negotiation errors and the like: reported, not raised
            self._fail(f"{type(exc).__name__}: {exc}")
        if self.result.state != "failed":
            self.result.state = "up"
            helpers = [
                asyncio.create_task(ping_every(self._send, self.latency.clock, PING_INTERVAL_S))
            ]
            if config.drag:
                moves = drag(self._send, config.seed, self.result.index, config.fps)
                helpers.append(asyncio.create_task(moves))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, (end_ms - now_ms()) / 1000.0)):
                    await self._stopped.wait()
            for helper in helpers:
                helper.cancel()
        await self._close()
        return self.result

    async def _open_by(self, end_ms: float) -> None:
        """`_open`, given up at the run's end while still queued: a stream that never got a
        frame is a failure, not a pass. (One still negotiating may finish: its error, say a
        codec the worker does not send, is the better reason; the report fails it anyway.)"""
        opening = asyncio.ensure_future(self._open())
        await asyncio.wait({opening}, timeout=max(0.0, (end_ms - now_ms()) / 1000.0))
        if not opening.done() and self.result.state == "queued":
            opening.cancel()
            position = self.result.queued_position
            raise StreamFailed(f"never started: queued at position {position} the whole run")
        await opening

    async def _open(self) -> None:
        self.result.state = "connecting"
        signaling = self.signaling
        try:
            info = await signaling.start(timeout=None)
        except aiohttp.WSServerHandshakeError as exc:
            raise StreamFailed(
                f"signaling refused the socket: {exc.status} {exc.message}"
            ) from None
        except SignalingError as exc:
            raise StreamFailed(_reason(exc)) from None
        self._watcher = asyncio.create_task(self._watch_socket())
        self.result.session_id = info.get("sessionId")
        self.result.worker_id = info.get("workerId")
        width, height = info.get("width"), info.get("height")
        if isinstance(width, int) and isinstance(height, int):
            self.result.started_size = f"{width}x{height}"
        self.result.state = "negotiating"

        # transport-cc feedback only when asked (`transport_feedback`): the lean receiver
        # times packets by the kernel's receive stamps, but the full one when aiortc hands
        # them on, and a harness sharing the cores with tens of streams would read its own
        # scheduling delays as congestion there; without it the worker follows REMB
        feedback = self.config.transport_feedback
        self.pc, receiver, self._channel = signaling.viewer_peer(
            self._on_message, self._on_channel_open, codec=self.config.codec,
            transport_feedback=False,
        )  # fmt: skip
        self.pc.on("connectionstatechange", self._on_connection_state)
        lean = None
        if self.config.receiver == "lean":
            lean = self._lean = LeanReceiver(
                receiver, self.assembler.add, self.assembler.set_codec, transport_feedback=feedback
            )
            self._feedback = lean.feedback
        elif self.config.receiver == "count":
            lean = self._lean = CountingReceiver(
                receiver, self._on_counted, self._sampler, transport_feedback=feedback
            )
            self._feedback = lean.feedback
        else:
            if feedback:
                self._feedback = send_transport_feedback(receiver)
            observe_receiver(receiver, self.assembler.add, on_codec=self.assembler.set_codec)
        self._count_feedback(receiver)
        try:
            await signaling.negotiate(self.pc, timeout=None)
        except SignalingError as exc:
            raise StreamFailed(_reason(exc)) from None
        if lean is not None:
            lean.rehook()
        waiter = asyncio.create_task(self._first_frame.wait())
        stopper = asyncio.create_task(self._stopped.wait())
        await asyncio.wait((waiter, stopper), return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()

    async def _close(self) -> None:
        """End the session the way a page does (session.end, then wait for session.ended so
        that every frame the worker counted has arrived), then tear everything down."""
        result = self.result
        if result.state != "failed":
            result.state = "closing"
            await self.signaling.end(END_WAIT_S)
        self._closing = True
        end = now_ms()
        if result.ended_s is None:
            result.ended_s = self._rel_s(end)
        if result.state != "failed":
            ended = self.signaling.ended
            if (ended is None or not ended.done()) and result.session_id is not None:
                result.reason = "the worker did not confirm the end of the session"
            result.state = "closed"
            # a stream still connected whose frames stopped: its silent tail is a freeze
            if self._last_frame_ms is not None:
                self._gap(end - self._last_frame_ms, end, tail=True)
        if self._watcher is not None:
            self._watcher.cancel()
        with contextlib.suppress(Exception):
            if self.pc is not None:
                await self.pc.close()
        with contextlib.suppress(Exception):
            await self.signaling.close()
        self.assembler.flush()
        if self._lean is not None:
            result.socket_packets = self._lean.stats.direct
            result.socket_reads = self._lean.gro.reads
            result.socket_stamped = self._lean.gro.stamped
            result.socket_dropped = self._lean.gro.dropped
        if self._feedback is not None:
            result.feedback_sent = self._feedback.sent
        if self.decoder is not None:
            await asyncio.to_thread(self.decoder.close)
        self._finish()

    def _fail(self, reason: str, at_ms: float | None = None) -> None:
        if self.result.state in ("failed", "closing", "closed") or self._closing:
            return
        self.result.state = "failed"
        self.result.reason = reason
        self.result.ended_s = self._rel_s(at_ms if at_ms is not None else now_ms())
        self._stopped.set()

    def _finish(self) -> None:
        """Fill the result's figures from the counters."""
        r = self.result
        stats = self.assembler.stats
        r.packets = self.packets
        r.duplicate_packets = stats.duplicates + stats.late  # of frames done, or given up
        r.incomplete_frames = stats.incomplete
        lean = self._lean  # a counting receiver's assembler sees no packet
        r.lost_packets = (
            lean.lost_packets if isinstance(lean, CountingReceiver) else stats.lost_packets
        )
        latency = self.latency
        r.timing_records, r.bad_timing = latency.record_count, latency.bad_timing
        if latency.clock.samples:
            r.clock = latency.clock.summary()
            for arrived, ms in latency.series():
                r.latency_t_s.append(self._rel_s(arrived))
                r.latency_ms.append(ms)
        if self.decoder is not None:
            r.decode = self.decoder.summary()

    # -- what it counts ----------------------------------------------------------------------

    def _count_feedback(self, receiver: RTCRtpReceiver) -> None:
        """Count the NACKs and PLIs aiortc's receiver sends, by wrapping its senders."""
        send_nack = receiver._send_rtcp_nack
        send_pli = receiver._send_rtcp_pli
        result = self.result

        async def nack(media_ssrc: int, lost: list[int]) -> None:
            result.nacks_sent += 1
            result.nacked_packets += len(lost)
            await send_nack(media_ssrc, lost)

        async def pli(media_ssrc: int) -> None:
            result.plis_sent += 1
            await send_pli(media_ssrc)

        receiver._send_rtcp_nack = nack  # type: ignore[method-assign]
        receiver._send_rtcp_pli = pli  # type: ignore[method-assign]

    def _on_counted(self, rtp: int, packets: int, size: int, arrival_ms: float) -> None:
        """A frame that `CountingReceiver` saw end (its datagram bytes; a keyframe only where
        it was sampled: nothing else was decrypted)."""
        sampler = self._sampler
        frame = ObservedFrame(
            rtp=rtp, first_ms=arrival_ms, last_ms=arrival_ms, size=size, packets=packets,
            lost=0, keyframe=sampler is not None and sampler.last_rtp == rtp,
            complete=True, index=self.result.frames, codec=self.config.codec,
        )  # fmt: skip
        if sampler is not None:
            sampler.counted()
        self._on_frame(frame, b"")

    def _on_sampled(self, frame: ObservedFrame, access_unit: bytes) -> None:
        """A frame the counting receiver unprotected whole for `KeyframeSampler`."""
        if self.decoder is not None and not self._closing:
            self.decoder.offer(frame, access_unit)

    def _on_frame(self, frame: ObservedFrame, access_unit: bytes) -> None:
        r = self.result
        if self._closing:
            return
        arrived = frame.last_ms
        if r.first_frame_s is None:
            r.first_frame_s = self._rel_s(arrived)
            self._first_frame.set()
        r.frames += 1
        r.bytes += frame.size
        r.frame_t_s.append(self._rel_s(arrived))
        if frame.keyframe:
            r.keyframes += 1
        second = max(0, int((arrived - self.t0_ms) // 1000))
        while len(r.frames_per_s) <= second:
            r.frames_per_s.append(0)
            r.bytes_per_s.append(0)
        r.frames_per_s[second] += 1
        r.bytes_per_s[second] += frame.size
        if self._last_frame_ms is not None:
            self._gap(arrived - self._last_frame_ms, arrived)
        self._last_frame_ms = (
            arrived if self._last_frame_ms is None else max(arrived, self._last_frame_ms)
        )
        self.latency.add_frame(frame)
        if self.decoder is not None:  # bytes only where the assembler kept them
            self.decoder.offer(frame, access_unit)

    def _gap(self, gap_ms: float, ended_ms: float, tail: bool = False) -> None:
        r = self.result
        if not tail:
            r.longest_gap_ms = max(r.longest_gap_ms, round(gap_ms, 1))
        if gap_ms > FREEZE_INTERVALS * self.interval_ms:
            r.freezes += 1
            r.freeze_ms = round(r.freeze_ms + gap_ms, 1)
            if len(r.freeze_events) < MAX_FREEZE_EVENTS:
                r.freeze_events.append((self._rel_s(ended_ms), round(gap_ms, 1)))

    # -- signaling and the data channel ------------------------------------------------------

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState if self.pc is not None else "closed"
        if state == "failed":
            self._fail("the peer connection failed (ICE or DTLS)")
        elif state == "closed" and not self._closing:
            # the worker closes its end when it ends the session: give the signaling's
            # session.ended, which says why, a moment to arrive first
            asyncio.get_running_loop().create_task(self._peer_closed(now_ms()))

    async def _peer_closed(self, at_ms: float) -> None:
        await asyncio.sleep(PEER_CLOSED_GRACE_S)
        self._fail("the peer connection closed", at_ms)

    def _on_channel_open(self) -> None:
        config = self.config
        request: dict[str, Any] = {
            "type": "quality",
            "width": config.resolution.width,
            "height": config.resolution.height,
            "fps": config.fps,
        }
        if config.max_kbps is not None:
            request["maxKbps"] = config.max_kbps
        self.result.quality_requested = request
        self._send(request)
        asyncio.get_running_loop().create_task(ping_burst(self._send, self.latency.clock))

    def _on_message(self, data: str | bytes) -> None:
        # timing records and pongs stop there; a pong is timed by its datagram's kernel stamp
        arrived = self._lean.control_ms if self._lean is not None else None
        message = self.latency.receive(data, arrived)
        if message is None:
            return
        kind = message.get("type")
        if kind == "quality":
            if self.result.quality_requested:  # the answer to ours (else the greeting on open)
                self.result.quality_applied = {
                    k: message.get(k) for k in ("width", "height", "fps", "maxKbps")
                }
            if isinstance(message.get("fps"), int | float) and message["fps"] > 0:
                self.interval_ms = 1000.0 / float(message["fps"])
        elif kind == "error" and len(self.result.worker_errors) < MAX_WORKER_ERRORS:
            self.result.worker_errors.append(message)

    def _send(self, message: dict[str, Any]) -> None:
        channel = self._channel
        if channel is not None and channel.readyState == "open":
            channel.send(json.dumps(message))

    def _on_signal(self, message: dict[str, Any]) -> None:
        """Server messages besides the handshake's (its failures raise out of `_open`)."""
        kind = message.get("type")
        if kind == "queue":
            self.result.state = "queued"
            self.result.queued_position = message.get("position")
        elif kind == "session.ended":
            if not self._closing and self.result.state != "closing":
                # the error that preceded it says why (it may come in the same read, before
                # the handshake's waiter has raised it)
                errors = self.signaling.errors
                why = f": {errors[-1].get('message')}" if errors else ""
                self._fail(f"the session was ended by the server ({message.get('reason')}){why}")
        elif kind == "session.interrupted":
            self._fail(f"the session was interrupted ({message.get('reason')})")
        elif kind == "error" and len(self.result.worker_errors) < MAX_WORKER_ERRORS:
            self.result.worker_errors.append(message)

    async def _watch_socket(self) -> None:
        await self.signaling.closed.wait()
        if not self._closing and self.result.state != "closing":
            self._fail("the signaling socket closed")


def _reason(exc: SignalingError) -> str:
    if exc.code in ("closed", "ended"):
        return exc.message
    return f"signaling error {exc.code}: {exc.message}"
