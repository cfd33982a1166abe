"""The paced send path: packets leave at the controller's rate, numbered transport-wide in
the order they leave; transport-cc feedback reaches the controller; a browser that sends none
leaves the path on REMB; the stock path (the benchmark's baseline) numbers nothing."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import RtpPacket

from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render.scene import Scene
from render_server.stream.session import StreamSession
from render_server.transport import send_path as send_path_module
from render_server.transport.congestion import CongestionController
from render_server.transport.feedback_generator import send_transport_feedback
from render_server.transport.header_extensions import TRANSPORT_CC_URI, SenderExtensionsMap
from render_server.transport.send_path import SendPath
from render_server.transport.transport_feedback import TransportFeedback
from render_server.worker.local import LocalWorker

TWCC_ID = 5


class FakeTransport:
    """The DTLS transport's two entry points the send path wraps, recording what leaves."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.state = "connected"
        self.sent: list[tuple[float, bytes]] = []
        self.rtcp_in: list[bytes] = []
        self._loop = loop

    async def _send_rtp(self, data: bytes) -> None:
        self.sent.append((self._loop.time(), data))

    async def _handle_rtcp_data(self, data: bytes) -> None:
        self.rtcp_in.append(data)


class FakeSender:
    """An RTCRtpSender as far as the send path reads it (aiortc's private names)."""

    def __init__(self, transport: FakeTransport) -> None:
        self.transport = transport
        self._ssrc = 1111
        self._rtx_ssrc = 2222
        extensions = SenderExtensionsMap(transport_cc=True)
        extensions.configure(RTCRtpParameters(headerExtensions=[
            RTCRtpHeaderExtensionParameters(id=TWCC_ID, uri=TRANSPORT_CC_URI)]))  # fmt: skip
        self._RTCRtpSender__rtp_header_extensions_map = extensions
        self._RTCRtpSender__rtp_history: dict[int, RtpPacket] = {}
        self._RTCRtpSender__rtx_payload_type: int | None = 97
        self._RTCRtpSender__rtx_sequence_number = 100
        self.retransmitted: list[int] = []

    async def _retransmit(self, sequence_number: int) -> None:
        self.retransmitted.append(sequence_number)
        await self.transport._send_rtp(self.packet(sequence_number, 300))

    def packet(self, sequence_number: int, size: int = 1200) -> bytes:
        packet = RtpPacket(payload_type=96, sequence_number=sequence_number, timestamp=9,
                           ssrc=self._ssrc, payload=b"\x00" * size)  # fmt: skip
        self._RTCRtpSender__rtp_history[sequence_number] = packet
        return packet.serialize(self._RTCRtpSender__rtp_header_extensions_map)


def transport_number(data: bytes) -> int:
    return int.from_bytes(data[17:19], "big")


async def test_a_burst_leaves_paced_numbered_in_order_and_rtcp_jumps_the_queue() -> None:
    loop = asyncio.get_running_loop()
    transport = FakeTransport(loop)
    sender = FakeSender(transport)
    # 4 Mbit/s, pacing 2.5x: 10 Mbit/s, a 100-packet frame (~124 kB) takes ~100 ms
    controller = CongestionController(start_bitrate=4_000_000, min_bitrate=100_000,
                                      max_bitrate=4_000_000)  # fmt: skip
    targets: list[int] = []
    path = SendPath(sender, controller, on_target=targets.append)
    path.install(4_000_000)
    try:
        started = loop.time()
        for i in range(100):
            await transport._send_rtp(sender.packet(i))
        rtcp = bytes([0x80, 200, 0, 1]) + b"\x00" * 4  # a sender report's header
        await transport._send_rtp(rtcp)
        assert transport.sent[-1][1] == rtcp  # RTCP is not queued behind the frame
        await sender._retransmit(3)  # a NACK's packet goes to the head of the queue
        while len(transport.sent) < 102:
            await asyncio.sleep(0.01)
        media = [(t, d) for t, d in transport.sent if d != rtcp]
        spread = media[-1][0] - started
        assert 0.06 <= spread <= 0.5, spread  # not one burst, nor far slower than the rate
        numbers = [transport_number(d) for _, d in media]
        assert numbers == list(range(101))  # in the order they left, the retransmission too
        retransmitted = next(i for i, (_, d) in enumerate(media) if len(d) < 1000)
        assert retransmitted < 10  # ahead of most of the frame queued before it
        assert path.packets == {"media": 100, "retransmission": 1}  # no RTX: on the media SSRC
        assert targets and targets[0] <= 4_000_000
    finally:
        await path.stop()


def paced_path(
    controller_max: int, stream_max: int
) -> tuple[FakeTransport, FakeSender, CongestionController, SendPath]:
    """A send path installed on a fake sender, its controller starting at 1 Mbit/s."""
    transport = FakeTransport(asyncio.get_running_loop())
    sender = FakeSender(transport)
    controller = CongestionController(start_bitrate=1_000_000, min_bitrate=100_000,
                                      max_bitrate=controller_max)  # fmt: skip
    path = SendPath(sender, controller, on_target=lambda _: None)
    path.install(stream_max)
    return transport, sender, controller, path


async def test_transport_feedback_reaches_the_controller_and_aiortc_gets_the_rest() -> None:
    transport, sender, controller, path = paced_path(8_000_000, 8_000_000)
    try:
        for i in range(20):
            await transport._send_rtp(sender.packet(i, 200))
        while len(transport.sent) < 20:
            await asyncio.sleep(0.005)
        feedback = TransportFeedback.build(
            0, sender._ssrc, 0, [(n, 1_000_000 + 1000 * n) for n in range(20)]
        )
        report = bytes([0x80, 201, 0, 1]) + b"\x00\x00\x00\x07"  # an empty receiver report
        await transport._handle_rtcp_data(report + bytes(feedback))
        assert path.mode == "transport-cc" and path.feedback_messages == 1
        assert transport.rtcp_in == [report]  # aiortc sees the report, not the feedback
        assert controller.state().acknowledged is not None or controller.state().rtt is not None
    finally:
        await path.stop()


async def test_feedback_from_before_the_first_packet_reaches_the_controller_without_it() -> None:
    """Numbers are unwrapped against the latest sent: early on, those that would unwrap below
    0 (a report reaching back past the first packet) were never sent and are left out."""
    transport, sender, controller, path = paced_path(8_000_000, 8_000_000)
    told: list[list[int]] = []
    on_feedback = controller.on_feedback

    def record(now: float, feedback: Any) -> None:
        told.append([item.sequence for item in feedback])
        on_feedback(now, feedback)

    controller.on_feedback = record  # type: ignore[method-assign]
    try:
        for i in range(20):
            await transport._send_rtp(sender.packet(i, 200))
        while len(transport.sent) < 20:
            await asyncio.sleep(0.005)
        wire = [((65530 + n) & 0xFFFF, 1_000_000 + 1000 * n) for n in range(26)]
        await transport._handle_rtcp_data(bytes(TransportFeedback.build(0, sender._ssrc, 0, wire)))
        assert told == [list(range(20))]
        assert path.feedback_messages == 1
    finally:
        await path.stop()


async def test_a_probe_waits_until_what_was_sent_crossed_the_link_at_the_estimate() -> None:
    """At a 1 Mbit/s estimate, 20 small packets and a 4-packet frame take ~80 ms to cross the
    link: the start-up probes' padding (RTX copies) follows them instead of joining them."""
    loop = asyncio.get_running_loop()
    transport, sender, _, path = paced_path(20_000_000, 5_000_000)
    try:
        started = loop.time()
        for i in range(20):
            await transport._send_rtp(sender.packet(i, 200))
        for i in range(20, 24):
            await transport._send_rtp(sender.packet(i))
        while len(transport.sent) < 24:
            await asyncio.sleep(0.002)
        feedback = TransportFeedback.build(
            0, sender._ssrc, 0, [(n, 1_000_000 + 1000 * n) for n in range(20)]
        )
        await transport._handle_rtcp_data(bytes(feedback))
        assert path.mode == "transport-cc"
        backlog = sum(len(d) + send_path_module.PACKET_OVERHEAD for _, d in transport.sent) * 8
        while path.packets["padding"] == 0 and loop.time() - started < 2.0:
            await asyncio.sleep(0.002)
        padding = [t for t, d in transport.sent if int.from_bytes(d[8:12], "big") == 2222]
        assert padding, "no probe"
        assert padding[0] - started >= 0.95 * backlog / 1_000_000
    finally:
        await path.stop()


async def test_without_feedback_the_path_follows_remb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(send_path_module, "FEEDBACK_WAIT_S", 0.2)
    loop = asyncio.get_running_loop()
    transport = FakeTransport(loop)
    sender = FakeSender(transport)
    controller = CongestionController(start_bitrate=1_000_000, min_bitrate=100_000,
                                      max_bitrate=6_000_000)  # fmt: skip
    targets: list[int] = []
    path = SendPath(sender, controller, on_target=targets.append)
    path.install(6_000_000)
    try:
        await transport._send_rtp(sender.packet(1))
        assert len(controller._history) == 1  # waiting for its report
        await asyncio.sleep(0.5)
        assert path.mode == "remb"
        assert len(controller._history) == 0  # no report will come: forgotten, not kept
        path.on_remb(2_500_000)  # counts the wire: the encoder is asked for its payload share
        share = path.sent.share
        assert 0.9 < share < 1
        assert path.target == int(2_500_000 * share) and targets[-1] == path.target
        path.on_remb(50_000_000)  # above the stream's most: the stream's most
        assert path.target == 6_000_000
    finally:
        await path.stop()


async def test_a_stopped_path_lets_go_of_its_unreported_packets() -> None:
    """Left to the session's reference cycles, a 4K session's unreported packets wait for a
    full collection, which stalls every other stream (25–36 ms for a few ended sessions)."""
    transport = FakeTransport(asyncio.get_running_loop())
    sender = FakeSender(transport)
    controller = CongestionController(1_000_000, 100_000, 6_000_000)
    path = SendPath(sender, controller, on_target=lambda target: None)
    path.install(6_000_000)
    for number in range(1, 6):
        await transport._send_rtp(sender.packet(number))
    await asyncio.sleep(0.2)  # the pacer lets them all out
    assert len(controller._history) == 5
    await path.stop()
    assert len(controller._history) == 0


# -- a real session and a real aiortc receiver -----------------------------------------------


async def stream_to_aiortc(
    scene: Scene, send_path: str, feedback: bool, seconds: float
) -> tuple[StreamSession, list[dict[str, Any]], list[int]]:
    """A worker session streaming to an aiortc peer for `seconds`: the session (still open),
    the page's messages and the transport-wide numbers the receiver saw."""
    stream = StreamConfig(resolution=Resolution(320, 240), encoder="x264", renderer="cpu",
                          send_path=send_path)  # fmt: skip
    worker = LocalWorker("w", scene, stream, 1, Metrics())

    async def on_end(reason: str) -> None:
        pass

    session = await worker.open_session("b" * 32, on_end)
    browser = RTCPeerConnection()
    messages: list[dict[str, Any]] = []
    numbers: list[int] = []
    transceiver = browser.addTransceiver("video", direction="recvonly")
    if feedback:
        send_transport_feedback(transceiver.receiver)
    receive = transceiver.receiver._handle_rtp_packet

    async def seen(packet: RtpPacket, arrival_time_ms: int) -> None:
        if packet.extensions.transport_sequence_number is not None:
            numbers.append(packet.extensions.transport_sequence_number)
        await receive(packet, arrival_time_ms)

    transceiver.receiver._handle_rtp_packet = seen  # type: ignore[method-assign]
    channel = browser.createDataChannel("input")
    channel.on("message", lambda data: messages.append(json.loads(data)))
    try:
        await browser.setLocalDescription(await browser.createOffer())
        answer = await session.accept_offer(browser.localDescription.sdp)
        await browser.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await asyncio.sleep(seconds)
    finally:
        await browser.close()
    return session, messages, numbers


async def test_a_session_runs_its_controller_on_an_aiortc_receivers_feedback(
    scene: Scene,
) -> None:
    session, messages, numbers = await stream_to_aiortc(scene, "paced", True, 4.0)
    try:
        path = session.send_path
        assert path is not None and path.mode == "transport-cc"
        assert path.feedback_messages >= 10  # every 50 ms
        assert len(numbers) > 50
        assert sorted(numbers) == list(range(min(numbers), max(numbers) + 1))  # none skipped
        network = [m for m in messages if m.get("type") == "network"]
        assert network and network[-1]["mode"] == "transport-cc"
        assert 0 < network[-1]["targetKbps"] <= session.path_control.max_bitrate() // 1000
        # the size sent, and its bandwidth step: full size at step 0 (a CI machine's load may
        # read as queueing and step it down within the 4 s: CI once read 240 wide)
        last = network[-1]
        assert last["step"] >= 0 and (last["step"] == 0) == (last["width"] == 320), last
    finally:
        await session.close("test")


async def test_the_stock_path_numbers_nothing_and_tells_the_page_nothing(scene: Scene) -> None:
    session, messages, numbers = await stream_to_aiortc(scene, "stock", True, 2.0)
    try:
        assert session.send_path is None
        assert numbers == []
        assert not [m for m in messages if m.get("type") == "network"]
        assert session.frames > 10
    finally:
        await session.close("test")
