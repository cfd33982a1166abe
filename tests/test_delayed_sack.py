"""Delayed SACKs: a worker's SCTP association acknowledges every second packet, within 200 ms,
and at once on a gap or a duplicate; messages still all arrive, and the sender's queue drains.
Real aiortc peers over loopback, and the rule on its own."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiortc import RTCPeerConnection, RTCSctpTransport
from aiortc.rtcsctptransport import SackChunk

from render_server.tools.signaling_client import SignalingClient
from render_server.transport.delayed_sack import SACK_DELAY_S, delay_sacks


class FakeAssociation:
    """What `delay_sacks` reads of an association, and the SACKs it sent."""

    def __init__(self) -> None:
        self._sack_misordered: set[int] = set()
        self._sack_duplicates: list[int] = []
        self._sack_needed = False
        self._association_state = RTCSctpTransport.State.ESTABLISHED
        self.sent: list[float] = []

    async def _send_sack(self) -> None:
        self.sent.append(time.monotonic())
        self._sack_needed = False

    async def packet(self) -> None:
        """A packet with DATA arrived: aiortc then asks for a SACK."""
        self._sack_needed = True
        await self._send_sack()


async def test_every_second_packet_is_acknowledged_and_a_lone_one_within_the_delay() -> None:
    sctp = FakeAssociation()
    delay_sacks(sctp)  # type: ignore[arg-type]
    delay_sacks(sctp)  # type: ignore[arg-type]  # once only
    await sctp.packet()
    assert sctp.sent == []
    await sctp.packet()
    assert len(sctp.sent) == 1  # the second packet
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    await sctp.packet()  # a lone one: acknowledged when the delay runs out
    # a timer of the same delay set just after, starting a task as the SACK's does: a loop
    # slowed by a loaded machine holds both alike, so the SACK is checked against it, not
    # against the wall clock
    reference: asyncio.Future[float] = loop.create_future()

    async def mark() -> None:
        reference.set_result(time.monotonic())

    tasks: list[asyncio.Task[None]] = []
    loop.call_later(SACK_DELAY_S, lambda: tasks.append(asyncio.ensure_future(mark())))
    await asyncio.sleep(SACK_DELAY_S / 2)
    assert len(sctp.sent) == 1
    await asyncio.sleep(SACK_DELAY_S)
    assert len(sctp.sent) == 2
    assert SACK_DELAY_S * 0.9 <= sctp.sent[1] - began
    assert sctp.sent[1] <= await reference
    await sctp.packet()
    await sctp.packet()  # the pair goes at once, and the timer with it
    assert len(sctp.sent) == 3
    await asyncio.sleep(SACK_DELAY_S * 1.5)
    assert len(sctp.sent) == 3


async def test_a_gap_or_a_duplicate_is_acknowledged_at_once() -> None:
    sctp = FakeAssociation()
    delay_sacks(sctp)  # type: ignore[arg-type]
    sctp._sack_misordered.add(7)  # a packet missing before this one: the peer must hear
    await sctp.packet()
    assert len(sctp.sent) == 1
    sctp._sack_misordered.clear()
    sctp._sack_duplicates.append(3)
    await sctp.packet()
    assert len(sctp.sent) == 2


async def test_a_closed_association_sends_no_late_sack() -> None:
    sctp = FakeAssociation()
    delay_sacks(sctp)  # type: ignore[arg-type]
    await sctp.packet()
    sctp._association_state = RTCSctpTransport.State.CLOSED
    await asyncio.sleep(SACK_DELAY_S * 1.5)
    assert sctp.sent == []


async def _pair() -> tuple[RTCPeerConnection, RTCPeerConnection, Any, asyncio.Queue[str]]:
    """A page-like peer with a data channel, and a worker-like peer whose SACKs are delayed."""
    page, worker = RTCPeerConnection(), RTCPeerConnection()
    channel = page.createDataChannel("input")
    received: asyncio.Queue[str] = asyncio.Queue()
    opened = asyncio.Event()
    channel.on("open", opened.set)

    @worker.on("datachannel")
    def on_channel(remote: Any) -> None:
        remote.on("message", received.put_nowait)

    await page.setLocalDescription(await page.createOffer())
    await worker.setRemoteDescription(page.localDescription)
    assert worker.sctp is not None
    delay_sacks(worker.sctp)
    await worker.setLocalDescription(await worker.createAnswer())
    await page.setRemoteDescription(worker.localDescription)
    await asyncio.wait_for(opened.wait(), 10)
    return page, worker, channel, received


async def test_real_peers_deliver_everything_with_half_the_sacks() -> None:
    page, worker, channel, received = await _pair()
    assert worker.sctp is not None
    sacks = 0
    send_chunk = worker.sctp._send_chunk

    async def counting(chunk: Any) -> None:
        nonlocal sacks
        sacks += isinstance(chunk, SackChunk)
        await send_chunk(chunk)

    worker.sctp._send_chunk = counting  # type: ignore[method-assign]
    try:
        messages = [f'{{"type":"pointer","n":{i}}}' for i in range(40)]
        for message in messages:  # one a tick, as a mouse reports: one packet each
            channel.send(message)
            await asyncio.sleep(0.004)
        got = [await asyncio.wait_for(received.get(), 5) for _ in messages]
        assert got == messages
        await asyncio.sleep(SACK_DELAY_S * 1.5)
        assert 10 <= sacks <= 25, sacks  # about every second packet, not all 40
        sctp = page.sctp
        assert sctp is not None and not sctp._sent_queue  # every message acknowledged
    finally:
        await page.close()
        await worker.close()


async def test_the_tools_clients_acknowledge_as_a_browser_does() -> None:
    # the load test, `render-server latency` and the viewer open their peers here: the worker
    # should get a browser's SACKs from them, not one for each timing message and pong
    pc, _, _ = SignalingClient("http://127.0.0.1:9").viewer_peer(lambda _: None, lambda: None)
    try:
        assert pc.sctp is not None and getattr(pc.sctp._send_sack, "delayed", False)
    finally:
        await pc.close()
