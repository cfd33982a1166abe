"""A session's send path: packets paced at the congestion controller's rate, numbered
transport-wide, and the browser's transport-cc feedback read back into the controller.

aiortc's sender writes each packet straight to its DTLS transport and obeys REMB alone. Here
a frame's packets (`send_frame`, from `frame_sender`; retransmissions through the transport's
`_send_rtp`) queue in a `PacingQueue`; what the rate lets out leaves in one batch
(`rtp_transmit`), each given its transport-wide number (`header_extensions` left a
placeholder) and the controller told what left when; probe clusters go as padding (RTX copies
of recent packets, dropped by the receiver as duplicates). The browser's RTCP passes through
`_handle_rtcp_data`, where transport-cc feedback (RTPFB FMT 15, which aiortc would misread as
NACKs) goes to the controller, whose target reaches the encoder through `on_target`. Where the
answer has RED and ULPFEC, `fec_path` renumbers the media on its way into the queue, adds FEC
after the frames it protects (while the feedback reports loss) and answers NACKs.

Without transport-cc feedback (an aiortc client without a feedback generator, an old browser)
the path stays in `remb` mode: REMB sets the target and packets leave at once, as aiortc's
(a queue that FEC or a backlog fills drains at 10 times the stream's maximum).

Checked against aiortc 1.16: the private `RTCDtlsTransport._send_rtp` and
`_handle_rtcp_data`, `RTCRtpSender._retransmit`, `_ssrc`, `_rtx_ssrc` and
`_RTCRtpSender__rtp_header_extensions_map` (`probe_padding` reads the rest)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any, Final

from aiortc.rtp import is_rtcp

from render_server.ticks import next_on_grid
from render_server.transport.congestion import (
    CongestionController,
    CongestionState,
    PacketFeedback,
    SentPacket,
)
from render_server.transport.congestion.record import ControllerRecorder
from render_server.transport.fec_path import FecPath, FecPayloadTypes, split_nacks
from render_server.transport.header_extensions import (
    send_time_extension_ids,
    write_transport_sequence,
)
from render_server.transport.pacer import PacingQueue
from render_server.transport.probe_padding import Prober, next_rtx_number
from render_server.transport.rtp_transmit import PacketOutput
from render_server.transport.transport_feedback import split_transport_feedback
from render_server.transport.wire_meter import WireMeter

log = logging.getLogger(__name__)

PROCESS_INTERVAL_S: Final = 0.025  # the controller's timers, as libwebrtc's 25 ms
REMB_INTERVAL_S: Final = 0.25
FEEDBACK_WAIT_S: Final = 2.0  # no transport-cc feedback this long after the first packet: REMB
PACKET_OVERHEAD: Final = 10 + 8 + 20  # SRTP tag, UDP, IPv4: the controller counts wire bytes
TARGET_STEP: Final = 0.05  # the encoder hears of a target that moved at least this share...
TARGET_EVERY_S: Final = 1.0  # ...or of any change after this long
FEC_LOSS_TOLERANCE: Final = 0.03
SEND_RATE_WINDOW_S: Final = 0.5
SEND_RATE_HEADROOM: Final = 1.5  # the pacer never runs slower than this x the sender's rate
FEC_HOLD_S: Final = 2.0  # no FEC this long after the target fell (congestion, not noise)
# the controller may estimate this many times the stream's most: the pacer's rate follows the
# estimate, and one held to 2.5x a 2.8 Mbit/s stream spreads a 720p frame over 13 ms
ESTIMATE_HEADROOM: Final = 4


class SendPath:
    """Paces one video sender's packets and runs its congestion controller.

    `install` after the offer is applied (the sender's transport is then final, BUNDLE
    included) and after anything else that wraps the transport's `_send_rtp` (timing records
    must see packets when they really leave); `stop` with the peer connection."""

    def __init__(
        self,
        sender: Any,
        controller: CongestionController | ControllerRecorder,
        on_target: Callable[[int], None],
        pacing_factor: float = 2.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sender = sender
        self.controller = controller
        self._on_target = on_target
        self._pacing_factor = pacing_factor
        self._clock = clock
        self.queue = PacingQueue(controller.pacing_bitrate)
        self.mode = "waiting"  # → "transport-cc" at the first feedback, "remb" without any
        self.feedback_messages = 0
        self.last_rtcp: float | None = None  # when the peer's RTCP last came: is it there?
        # packets sent by kind: media, rtx (NACKs answered on RTX), retransmission (on the
        # media stream, without RTX), padding (probes), fec (ULPFEC packets, sent or resent)
        self.packets: collections.Counter[str] = collections.Counter()
        self._max_bitrate = 0
        self._remb: int | None = None
        self._sequence = 0  # transport-wide, unwrapped; the wire carries its low 16 bits
        self._first_sent: float | None = None
        self._retransmitting = False
        self._stopping = False
        self._last_decrease = -FEC_HOLD_S  # when the target last fell by a tenth or more
        # what the sender hands over: its rate, and the encoder's share of the wire's bits
        self.sent = WireMeter(clock(), SEND_RATE_WINDOW_S)
        self._told: tuple[int, float] | None = None  # target last given the encoder, and when
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.prober = Prober(sender, PACKET_OVERHEAD)
        self.fec: FecPath | None = None  # where the answer has RED and ULPFEC, once sending
        self._fec_types: FecPayloadTypes | None = None
        self._last_media: int | None = None  # aiortc's number of the last media packet
        self._transport: Any = None
        self.output: PacketOutput | None = None

    # -- installation ------------------------------------------------------------------------

    def install(self, max_bitrate: int) -> None:
        """Take over the sender's transport: its RTP from here leaves through `send_frame`."""
        transport = self.sender.transport
        self.output = PacketOutput(transport, self.sender._ssrc)
        handle_rtcp: Callable[[bytes], Awaitable[None]] = transport._handle_rtcp_data
        retransmit: Callable[[int], Awaitable[None]] = self.sender._retransmit

        async def send_rtp(data: bytes) -> None:
            if is_rtcp(data):
                assert self.output is not None
                await self.output.rtcp(data)
            else:
                await self.send_frame((data,))

        async def handle_rtcp_data(data: bytes) -> None:
            self.last_rtcp = self._clock()
            feedbacks, rest = split_transport_feedback(data)
            holes = [p for feedback in feedbacks for p in self._on_feedback(feedback.packets)]
            fec = self.fec
            if fec is not None:  # NACKs name wire numbers: ours to translate, not aiortc's
                lost, rest = split_nacks(rest, fec.media_ssrc)
                media, repeats = fec.nack(lost)
                for packet in holes + repeats:
                    self.queue.push(bytearray(packet), self._clock(), True, kind="fec")
                    self._wake.set()
                for number in media:
                    await self.sender._retransmit(number)
            if rest:
                await handle_rtcp(rest)

        async def retransmit_first(sequence_number: int) -> None:
            self._retransmitting = True  # its packet goes to the head of the queue
            try:
                await retransmit(sequence_number)
            finally:
                self._retransmitting = False

        self._transport = transport
        self._media_ssrc = self.sender._ssrc.to_bytes(4, "big")
        transport._send_rtp = send_rtp
        transport._handle_rtcp_data = handle_rtcp_data
        self.sender._retransmit = retransmit_first
        self.set_max_bitrate(max_bitrate)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def send_frame(self, packets: Sequence[bytes]) -> None:
        """A frame's RTP packets in order (or one retransmission): paced, or at once, unpaced."""
        if self._transport.state != "connected":  # as aiortc's: its sender loop ends on this
            raise ConnectionError("Cannot send encrypted RTP, not connected")
        now = self._clock()
        self.sent.add(packets, PACKET_OVERHEAD, repeat=self._retransmitting)
        if self.mode == "remb" and self.fec is None and not len(self.queue):
            # no feedback, nothing to pace against: aiortc's own way, at once
            if self._retransmitting:
                for data in packets:
                    self.packets[self._kind(data, True)] += 1
            else:
                self.packets["media"] += len(packets)
            await self._transmit(packets, now)
            return
        for data in packets:
            self._enqueue(data, now)
        if self.prober.run is None:  # what the budget lets out now leaves now: no task hop
            await self._send_ready(now)
        if len(self.queue):
            self._wake.set()

    def _enqueue(self, data: bytes, now: float) -> None:
        fec = self.fec
        if fec is None and self._fec_types is not None and not self._retransmitting:
            fec = self._start_fec()
        if fec is None:
            self.queue.push(bytearray(data), now, self._retransmitting)
        elif self._retransmitting:
            for wire in fec.retransmissions(data):
                self.queue.push(bytearray(wire), now, True)
        elif data[8:12] == self._media_ssrc:
            media, *protection = fec.media(data)  # ULPFEC packets after a frame's last
            self.queue.push(bytearray(media), now)
            for packet in protection:
                self.queue.push(bytearray(packet), now, kind="fec")
        else:
            self.queue.push(bytearray(data), now)
        if not self._retransmitting and data[8:12] == self._media_ssrc:
            self._last_media = int.from_bytes(data[2:4], "big")

    def on_marker(self, observer: Callable[[int, float], None]) -> None:
        """Call `observer(rtp_timestamp, ms)` as each frame's last packet leaves (timing)."""
        assert self.output is not None
        self.output.on_marker = observer

    async def stop(self) -> None:
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # the pacer failed earlier: said here, not raised
                log.error("send_path.pacer_failed", extra={"error": repr(exc)[:300]})
            self._task = None
        self.controller.forget_sent()

    # -- what the session tells it -------------------------------------------------------------

    @property
    def max_bitrate(self) -> int:
        return self._max_bitrate

    def set_max_bitrate(self, max_bitrate: int) -> None:
        """The most the session's stream spends (its size and rate, the page's cap)."""
        self._max_bitrate = max_bitrate
        least = max(100_000, max_bitrate // 10)  # a tenth of the stream's, 100 kbit/s at least
        self.controller.set_bitrates(least, max_bitrate * ESTIMATE_HEADROOM)
        self._update_rates(force=True)

    def enable_fec(self, types: FecPayloadTypes, copies: bool = True) -> None:
        """Protect frames with ULPFEC in RED (`types`, from the answer) while the path loses
        packets, FEC packets twice with `copies` (fec_path); before the first packet."""
        self._fec_types, self._fec_copies = types, copies
        # random loss up to this ULPFEC repairs before the browser notices (fec_path)
        self.controller.set_loss_tolerance(FEC_LOSS_TOLERANCE)

    def _start_fec(self) -> FecPath:
        """The FEC path, at the first media packet (aiortc has set the header-extension ids)."""
        assert self._fec_types is not None
        zero = send_time_extension_ids(self.sender._RTCRtpSender__rtp_header_extensions_map)
        copies = self._fec_copies and self.sender._RTCRtpSender__rtx_payload_type is not None
        rtx = (lambda: next_rtx_number(self.sender)) if copies else None
        self.fec = FecPath(self.sender._ssrc, self.sender._rtx_ssrc, self._fec_types, zero, rtx)
        return self.fec

    def on_remb(self, bitrate: int) -> None:
        self._remb = bitrate
        self.controller.on_remb(self._clock(), bitrate)
        self._update_rates()

    def state(self) -> dict[str, Any]:
        """What the page's stats and the session's log show of the path."""
        snapshot: CongestionState = self.controller.state()
        return {
            "mode": self.mode,
            **asdict(snapshot),
            "target": self.target,
            "queue_ms": round(self.queue.queue_delay(self._clock()) * 1e3, 1),
            "probes": self.prober.started,
        }

    @property
    def target(self) -> int:
        """The encoder's target now (bits/s): the estimate (REMB's, or the controller's) less
        the packets' own bytes and what is sent again (`wire_meter`: the estimate counts the
        wire, the encoder makes payload), within the stream's most."""
        wire = self._remb if self.mode == "remb" else self.controller.target_bitrate
        if wire is None:
            return self._max_bitrate
        return min(int(wire * self.sent.share), self._max_bitrate)

    # -- the pacer -------------------------------------------------------------------------------

    async def _run(self) -> None:
        next_process = 0.0
        while not self._stopping:
            now = self._clock()
            if now >= next_process:
                self.controller.process(now)
                self._check_feedback(now)
                self._update_rates()
                # on REMB alone the controller has nothing to time: the rates now and then
                idle = self.mode == "remb"  # on every session's grid (`ticks`)
                next_process = next_on_grid(now, REMB_INTERVAL_S if idle else PROCESS_INTERVAL_S)
            await self._send_ready(now)
            prober = self.prober
            if self.mode == "transport-cc":
                prober.begin(now, self.controller.next_probe)
            if prober.run is not None:
                cluster = prober.run.cluster.id
                padding = prober.padding(now, self._last_media, self.fec)
                self.packets["padding"] += len(padding)
                await self._transmit(self._number(padding, now, cluster), now)
            wait = self.queue.wait(now)
            until = max(0.0, next_process - self._clock())
            probe_wait = prober.wait(now)
            if probe_wait is not None:
                wait = probe_wait if wait is None else min(wait, probe_wait)
            if wait is None:
                self._wake.clear()
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
                # that lands as its timeout expires, and this wait times out every 25 ms
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(until):
                        await self._wake.wait()
            elif wait > 0:
                await asyncio.sleep(min(wait, until))
            else:
                await asyncio.sleep(0)  # let the sender's loop and RTCP run between bursts

    async def _send_ready(self, now: float) -> None:
        ready = self.queue.pop(now)
        if ready:
            packets = self.packets
            for packet in ready:
                packets[packet.kind or self._kind(packet.data, packet.retransmission)] += 1
            batch = self._number([packet.data for packet in ready], now, self.prober.cluster_id)
            self.prober.sent(batch, now)
            await self._transmit(batch, now)

    def _number(self, batch: list[bytearray], now: float, cluster: int | None) -> list[bytearray]:
        """`batch` with transport-wide numbers written, each told to the controller as sent.
        A batch at a time: at 4K60 this runs for 2,700 packets a second a stream."""
        ids = self.sender._RTCRtpSender__rtp_header_extensions_map
        extension_id = getattr(ids, "transport_cc_id", None)
        if extension_id is None:
            return batch
        reporting = self.mode != "remb"  # on REMB alone no feedback will ever name them
        on_sent, fec = self.controller.on_packet_sent, self.fec
        sequence = first = self._sequence
        for data in batch:
            if write_transport_sequence(data, extension_id, sequence & 0xFFFF):
                if reporting:
                    on_sent(SentPacket(sequence, len(data) + PACKET_OVERHEAD, now, cluster))
                    if fec is not None:
                        fec.on_sent(data, sequence)
                sequence += 1
        self._sequence = sequence
        if self._first_sent is None and sequence != first:
            self._first_sent = now
        return batch

    def _kind(self, data: bytes | bytearray, retransmission: bool) -> str:
        if not retransmission:
            return "media"
        rtx = int.from_bytes(data[8:12], "big") == self.sender._rtx_ssrc
        return "rtx" if rtx else "retransmission"

    async def _transmit(self, batch: Sequence[bytes | bytearray], now: float) -> None:
        assert self.output is not None
        if self.mode != "remb":  # on REMB alone no probe ever waits on the backlog
            self.prober.backlog.add(batch, PACKET_OVERHEAD, now, self.controller.estimate)
        await self.output.rtp(batch)

    # -- feedback ---------------------------------------------------------------------------

    def _on_feedback(self, packets: tuple[tuple[int, int | None], ...]) -> list[bytes]:
        if self._sequence == 0:
            return []
        latest = self._sequence - 1
        results = [  # unwrapped: never ahead of the latest
            PacketFeedback(latest - ((latest - wire) & 0xFFFF), None if us is None else us / 1e6)
            for wire, us in packets
        ]
        if latest < 0xFFFF:  # early on, a number that unwraps below 0 was never sent
            results = [result for result in results if result.sequence >= 0]
        if not results:
            return []
        self.feedback_messages += 1
        if self.mode != "transport-cc":
            self.mode = "transport-cc"
            log.info("send_path.transport_cc", extra={"sequence": latest})
        self.controller.on_feedback(self._clock(), results)
        self._update_rates()
        return self.fec.on_feedback(results) if self.fec is not None else []  # FEC to resend

    def _check_feedback(self, now: float) -> None:
        first = self._first_sent
        if self.mode == "waiting" and first is not None and now - first > FEEDBACK_WAIT_S:
            self.mode = "remb"
            self.controller.forget_sent()  # never to be reported
            log.info("send_path.remb", extra={"reason": "no transport-cc feedback"})

    def _update_rates(self, force: bool = False) -> None:
        target, now = self.target, self._clock()
        # what the encoder really sends, smoothed: an encoder that does not follow the target
        # (a replayed clip; a keyframe burst) is paced at its own rate, not queued behind it
        self.sent.update(now)
        floor = int(SEND_RATE_HEADROOM * (self.sent.rate or 0))
        if self.mode == "transport-cc":
            pacing = self.controller.pacing_bitrate
        elif self.mode == "waiting":  # the first feedback is a round trip away: the stream's
            pacing = int(self._max_bitrate * self._pacing_factor)
        else:  # no estimate of the path: keyframe bursts spread, frames barely held
            pacing = int(self._max_bitrate * self._pacing_factor * ESTIMATE_HEADROOM)
        self.queue.set_rate(max(pacing, floor))
        if self._told is not None and target < 0.9 * self._told[0]:
            self._last_decrease = now
        fec = self.fec
        if fec is not None and self.mode == "transport-cc":
            # loss while the path is congested is the queue overflowing: FEC would only add
            # to it; random loss on an uncongested path is what it repairs
            state = self.controller.state()
            congested = state.usage == "overusing" or now - self._last_decrease < FEC_HOLD_S
            fec.set_protection(0 if congested else fec.protection(now, state.loss))
            # FEC's share comes out of the estimate: on a fat path the encoder keeps its rate
            payload = self.controller.target_bitrate * self.sent.share
            estimate = payload * 255 / (255 + fec.share)
            target = int(min(target, estimate))
        elif fec is not None and self.mode == "remb":  # no loss reports: no FEC
            fec.set_protection(0)
        told = self._told
        if (
            force
            or told is None
            or abs(target - told[0]) >= TARGET_STEP * told[0]
            or (target != told[0] and now - told[1] >= TARGET_EVERY_S)
        ):
            self._told = (target, now)
            self._on_target(target)
            log.debug(
                "send_path.target",
                extra={"target": target, "pacing": self.queue.rate, "mode": self.mode,
                       "queue_ms": round(self.queue.queue_delay(now) * 1e3, 1)},
            )  # fmt: skip
