"""Segmented sends (`UDP_SEGMENT`) put on the wire exactly the datagrams separate sends would,
in order, through a real asyncio datagram transport on loopback; a socket the kernel refuses
segmentation for (`SO_NO_CHECK`: no checksum, no offload) still delivers every datagram, one
send each, and is not asked again."""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import pytest

from render_server.transport.udp_segments import SegmentedSender, segment_runs

SO_NO_CHECK = 11  # asm-generic/socket.h


def test_runs_are_equal_sizes_ended_by_a_shorter_one() -> None:
    assert segment_runs([]) == []
    assert segment_runs([100]) == [(0, 1)]
    # larger fragments first, then one byte shorter: the first shorter one closes the run
    assert segment_runs([101, 101, 100, 100, 100]) == [(0, 3), (3, 5)]
    assert segment_runs([100, 100, 120, 120, 40, 40]) == [(0, 2), (2, 5), (5, 6)]
    assert segment_runs([50, 60]) == [(0, 1), (1, 2)]  # a longer one never joins


def test_runs_keep_to_the_kernels_limits() -> None:
    assert segment_runs([1000] * 150) == [(0, 64), (64, 128), (128, 150)]  # 64 segments
    assert segment_runs([1400] * 100) == [(0, 46), (46, 92), (92, 100)]  # 65,000 bytes


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.arrived = asyncio.Event()
        self.expected = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)
        if len(self.datagrams) >= self.expected:
            self.arrived.set()


async def send_through(refuse: bool) -> tuple[list[bytes], list[bytes], SegmentedSender]:
    loop = asyncio.get_running_loop()
    receiver, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    if refuse:
        sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    sender_transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=sock)
    # a frame's packets as aiortc cuts them (a NAL's fragments a byte apart), a small one,
    # views as the batch protector hands them over
    sizes = [1201] * 5 + [1200] * 20 + [57] + [900, 900, 899] + [1100] * 10
    datagrams = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    buffer = memoryview(b"".join(datagrams))
    views, offset = [], 0
    for data in datagrams:
        views.append(buffer[offset : offset + len(data)])
        offset += len(data)
    collector.expected = len(datagrams)
    segments = SegmentedSender(sender_transport)
    try:
        segments.send(views, receiver.get_extra_info("sockname"))
        await asyncio.wait_for(collector.arrived.wait(), 5)
    finally:
        sender_transport.close()
        receiver.close()
    return datagrams, collector.datagrams, segments


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_SEGMENT is Linux's")
async def test_segmented_sends_arrive_as_the_same_datagrams_in_order() -> None:
    sent, received, segments = await send_through(refuse=False)
    assert received == sent
    assert segments.enabled and segments.refused is None
    assert segments.segmented == len(sent)  # every run here has two or more


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_SEGMENT is Linux's")
async def test_a_socket_that_refuses_segments_still_sends_everything() -> None:
    sent, received, segments = await send_through(refuse=True)
    assert received == sent
    assert segments.refused is not None and not segments.enabled
    assert segments.segmented == 0


async def test_a_transport_without_a_socket_gets_every_datagram_as_bytes() -> None:
    class Relay:  # as aioice's TURN transport: no socket of its own
        def __init__(self) -> None:
            self.sent: list[tuple[Any, Any]] = []

        def sendto(self, data: Any, address: Any) -> None:
            self.sent.append((data, address))

    relay = Relay()
    segments = SegmentedSender(relay)
    segments.send([memoryview(b"ab"), memoryview(b"cd")], ("10.0.0.1", 9))
    assert not segments.enabled
    assert relay.sent == [(b"ab", ("10.0.0.1", 9)), (b"cd", ("10.0.0.1", 9))]
    assert all(type(data) is bytes for data, _ in relay.sent)
