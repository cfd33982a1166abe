"""Transport-wide congestion control feedback from an aiortc receiver, which sends none itself.

A sender that estimates bandwidth from transport-cc (Chromium, and this server's send path)
learns nothing from an aiortc client: aiortc parses the transport-wide sequence number
extension when it was negotiated, and drops it. The measuring tools and the load test receive
with aiortc, so this module plays the part of libwebrtc's `RemoteEstimatorProxy` for them:

- `TransportFeedbackGenerator` (sans-IO) takes each packet's transport-wide sequence number
  and arrival time and, on `build`, returns the feedback for everything that arrived since
  the last call: from the first number not yet reported to the last one received, the
  numbers in between that did not arrive reported lost, split into packets of at most
  ~1000 bytes (or where a delta would not fit 16 bits). A packet that arrives after the
  feedback that reported it lost reopens the window there, and the next feedback reports it
  (and those after it again), as libwebrtc does.
- `send_transport_feedback` attaches one to an `RTCRtpReceiver`: it wraps whatever
  `_handle_rtp_packet` the instance has at the time (aiortc's, or `receiver_hook`'s, which
  wraps in turn whatever it finds, so the two compose in either order) and sends the
  feedback through the receiver's own `_send_rtcp` every `interval_s` until the receiver
  stops.

Arrival times are `time.monotonic()` in µs: the reference time of transport-cc feedback has an
arbitrary origin, a sender uses only differences.

Checked against aiortc 1.16 (see transport/__init__.py): `RTCRtpReceiver._handle_rtp_packet`
(replaced on the instance), `_send_rtcp(packet)` (one packet: anything with `__bytes__`, sent
as its own SRTCP datagram), and the private `__rtcp_ssrc` (the feedback's sender SSRC, set
when negotiated) and `__rtcp_task` (done once the receiver has stopped).
"""

from __future__ import annotations

import asyncio
import logging
import time
from bisect import bisect_left, insort
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiortc import RTCRtpReceiver
from aiortc.rtp import RtpPacket

from .transport_feedback import FeedbackBuilder, TransportFeedback
from .transport_feedback_sequence import SequenceUnwrapper

log = logging.getLogger(__name__)

MAX_FEEDBACK_BYTES: Final = 1000  # a feedback packet, RTCP header included: well inside an MTU
DEFAULT_INTERVAL_S: Final = 0.05  # libwebrtc sends every 50..250 ms (5 % of the bitrate)
# a packet reported and older than this is forgotten: it can no longer be reported again
BACK_WINDOW_US: Final = 500_000
# the most sequence numbers remembered (libwebrtc's PacketArrivalTimeMap::kMaxNumberOfPackets)
MAX_TRACKED: Final = 1 << 15
# a feedback reports at most this many lost numbers before its first received one
MAX_MISSING: Final = 0x7FFE


class TransportFeedbackGenerator:
    """Transport-cc feedback for the packets a receiver got, without I/O.

    Call `on_packet` for every arriving packet that carries a transport-wide sequence number,
    and `build` every feedback interval. `sender_ssrc` (the receiver's RTCP SSRC) and
    `media_ssrc` (the last packet's SSRC, when `on_packet` is told it) go into each packet.
    """

    def __init__(
        self,
        sender_ssrc: int = 0,
        media_ssrc: int = 0,
        max_packet_bytes: int = MAX_FEEDBACK_BYTES,
    ) -> None:
        self.sender_ssrc = sender_ssrc
        self.media_ssrc = media_ssrc
        self.max_packet_bytes = max_packet_bytes
        self._unwrapper = SequenceUnwrapper()
        self._arrivals: dict[int, int] = {}  # unwrapped sequence number: arrival in µs
        # the same numbers in ascending order: a feedback reads its numbers off the end, and
        # the oldest are forgotten off the front, without sorting them all every interval
        self._order: list[int] = []
        self._window_start: int | None = None  # the first number not reported yet
        self._end = 0  # one past the newest number received
        self._floor: int | None = None  # numbers below were forgotten: ignored if they come
        self._feedback_count = 0  # the next packet's 8-bit feedback count, not wrapped

    @property
    def feedback_count(self) -> int:
        """How many feedback packets `build` has made."""
        return self._feedback_count

    def on_packet(self, transport_seq: int, arrival_us: int, media_ssrc: int | None = None) -> None:
        """A packet with transport-wide sequence number `transport_seq` arrived at
        `arrival_us` (its SSRC `media_ssrc`). A duplicate keeps its first arrival."""
        seq = self._unwrapper.unwrap(transport_seq & 0xFFFF)
        if media_ssrc is not None:
            self.media_ssrc = media_ssrc
        if (self._floor is not None and seq < self._floor) or seq < self._end - MAX_TRACKED:
            return  # too old: forgotten, or far behind the newest
        arrivals, order = self._arrivals, self._order
        if seq in arrivals:
            return
        arrivals[seq] = arrival_us
        if not order or seq > order[-1]:
            order.append(seq)
        else:  # reordered: rare
            insort(order, seq)
        self._end = max(self._end, seq + 1)
        if self._window_start is None or seq < self._window_start:
            self._window_start = seq  # first, or late: report from here on
        if len(arrivals) > MAX_TRACKED:  # build not called for long: forget the oldest
            self._forget_below(order[len(order) // 2])

    def build(self, now_us: int) -> list[TransportFeedback]:
        """The feedback for everything received since the last call (none if nothing was),
        in sequence order; packets reported and older than `BACK_WINDOW_US` before `now_us`
        are forgotten."""
        feedback: list[TransportFeedback] = []
        start = self._window_start
        if start is not None and start < self._end:
            received = self._order[bisect_left(self._order, start) :]
            i = 0
            while i < len(received):
                first = received[i]
                builder = FeedbackBuilder(
                    self.sender_ssrc,
                    self.media_ssrc,
                    self._feedback_count & 0xFF,
                    max(start, first - MAX_MISSING),
                    self._arrivals[first],
                    self.max_packet_bytes,
                )
                while i < len(received) and builder.add_received(
                    received[i], self._arrivals[received[i]]
                ):
                    i += 1
                if builder.status_count == 0:  # cannot happen: one packet always fits
                    i += 1
                    continue
                feedback.append(builder.build())
                self._feedback_count += 1
                start = received[i - 1] + 1
            self._window_start = self._end
        self._cull(now_us - BACK_WINDOW_US)
        return feedback

    def _cull(self, before_us: int) -> None:
        """Forget the oldest reported packets that arrived before `before_us`."""
        window_start = self._window_start
        if window_start is None:
            return
        arrivals, order = self._arrivals, self._order
        oldest = 0
        while (
            oldest < len(order)
            and order[oldest] < window_start
            and arrivals[order[oldest]] < before_us
        ):
            oldest += 1
        if oldest:
            self._forget_below(order[oldest - 1] + 1)

    def _forget_below(self, floor: int) -> None:
        arrivals, order = self._arrivals, self._order
        below = bisect_left(order, floor)
        for seq in order[:below]:
            del arrivals[seq]
        del order[:below]
        self._floor = floor if self._floor is None else max(self._floor, floor)
        if self._window_start is not None and self._window_start < floor:
            self._window_start = floor


RtpHandler = Callable[[RtpPacket, int], Awaitable[None]]


class TransportFeedbackHandle:
    """What `send_transport_feedback` attached: its generator, how many feedback packets it
    sent, its task (which ends by itself once the receiver stops); `stop()` cancels the task
    and ends the recording (the hook stays, passing packets straight on, so that hooks added
    after it keep working)."""

    def __init__(self, generator: TransportFeedbackGenerator) -> None:
        self.generator = generator
        self.sent = 0  # feedback packets handed to the receiver's transport
        self.task: asyncio.Task[None] | None = None
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        self._stopped = True
        if self.task is not None:
            self.task.cancel()


def send_transport_feedback(
    receiver: RTCRtpReceiver,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_packet_bytes: int = MAX_FEEDBACK_BYTES,
) -> TransportFeedbackHandle:
    """Make `receiver` send transport-cc feedback every `interval_s` for the packets that
    carry a transport-wide sequence number (the extension negotiated), until it stops or
    the handle's `stop()`. Call it with the event loop running, right after `addTransceiver`
    (before any packet arrives); it composes with `receiver_hook.observe_receiver` in either
    order."""
    handle_rtp = getattr(receiver, "_handle_rtp_packet", None)
    if not callable(handle_rtp):
        raise RuntimeError("this aiortc's RTCRtpReceiver has no packet hook")
    inner: RtpHandler = handle_rtp
    handle = feedback_sender(receiver, interval_s, max_packet_bytes)
    generator = handle.generator
    monotonic = time.monotonic

    async def recorded(packet: RtpPacket, arrival_time_ms: int) -> None:
        seq = packet.extensions.transport_sequence_number
        if seq is not None and not handle.stopped:
            generator.on_packet(seq, int(monotonic() * 1e6), packet.ssrc)
        await inner(packet, arrival_time_ms)

    receiver._handle_rtp_packet = recorded  # type: ignore[method-assign]
    return handle


def feedback_sender(
    receiver: RTCRtpReceiver,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_packet_bytes: int = MAX_FEEDBACK_BYTES,
) -> TransportFeedbackHandle:
    """A generator whose feedback `receiver` sends every `interval_s` until it stops: the
    caller feeds `handle.generator.on_packet` (a receive path that reads packets before
    aiortc does, `lean_receiver`). Call it with the event loop running."""
    send_rtcp = getattr(receiver, "_send_rtcp", None)
    if not callable(send_rtcp):
        raise RuntimeError("this aiortc's RTCRtpReceiver has no RTCP sender")
    loop = asyncio.get_running_loop()
    handle = TransportFeedbackHandle(TransportFeedbackGenerator(max_packet_bytes=max_packet_bytes))
    handle.task = loop.create_task(_send_periodically(receiver, send_rtcp, handle, interval_s))
    return handle


def _receiver_stopped(receiver: RTCRtpReceiver) -> bool:
    """Its RTCP task ended (`stop()` after `receive()`), or its transports closed (a peer
    connection closed before the receiver started)."""
    rtcp_task = getattr(receiver, "_RTCRtpReceiver__rtcp_task", None)
    if rtcp_task is not None and rtcp_task.done():
        return True
    dtls = receiver.transport
    return dtls.state == "closed" or dtls.transport.state == "closed"


async def _send_periodically(
    receiver: RTCRtpReceiver,
    send_rtcp: Callable[[Any], Awaitable[None]],
    handle: TransportFeedbackHandle,
    interval_s: float,
) -> None:
    generator = handle.generator
    try:
        while not handle.stopped:
            await asyncio.sleep(interval_s)
            if _receiver_stopped(receiver):
                break
            rtcp_ssrc = getattr(receiver, "_RTCRtpReceiver__rtcp_ssrc", None)
            if rtcp_ssrc is None:
                continue  # not negotiated yet: keep what arrives for later
            generator.sender_ssrc = rtcp_ssrc
            for feedback in generator.build(int(time.monotonic() * 1e6)):
                await send_rtcp(feedback)  # aiortc drops it quietly when not connected
                handle.sent += 1
    except Exception:  # a feedback sender must not end the client's loop with a traceback
        log.warning("transport.feedback_failed", exc_info=True)
    finally:
        handle._stopped = True
