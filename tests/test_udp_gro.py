"""Coalesced reads (`UDP_GRO`) hand the protocol exactly the datagrams the sender wrote, in
order: segmented runs the kernel delivers whole are cut back at the segment size, datagrams
sent one by one arrive as they were, and STUN-sized ones between them too; each read is
handed on with the kernel's receive time, and with what the kernel dropped at the socket."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import struct
import sys
import time
from typing import Any

import pytest

from render_server.transport.udp_gro import (
    SO_RXQ_OVFL,
    SO_TIMESTAMPNS,
    UDP_GRO,
    GroStats,
    ReadClock,
    drop_count,
    read_coalesced,
    receive_time_ns,
    segment_size,
    split,
)
from render_server.transport.udp_segments import SOL_UDP, SegmentedSender

SO_NO_CHECK = 11  # asm-generic/socket.h: no checksum, so no segmentation offload


def test_a_run_is_cut_at_its_segment_size() -> None:
    run = b"a" * 1200 + b"b" * 1200 + b"c" * 57
    assert split(run, 1200) == [b"a" * 1200, b"b" * 1200, b"c" * 57]
    assert split(run, 0) == [run]  # no control message: one datagram
    assert split(b"x" * 100, 1200) == [b"x" * 100]
    assert segment_size([(17, 104, (1200).to_bytes(4, sys.byteorder))]) == 1200
    assert segment_size([(1, 2, b"\0\0\0\0")]) == 0


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self.arrived = asyncio.Event()
        self.expected = 0
        self.errors: list[Exception] = []
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams.append(data)
        if len(self.datagrams) >= self.expected:
            self.arrived.set()


async def receive(
    segmented: bool, take_run: Any = None, made: Any = None
) -> tuple[list[bytes], list[bytes], GroStats, bool]:
    loop = asyncio.get_running_loop()
    receiver, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    if made is not None:
        made(collector)
    stats = GroStats()
    taken = read_coalesced(
        receiver, collector.datagram_received, collector.errors.append, stats, take_run
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    if not segmented:
        sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
    sender, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, sock=sock)
    sizes = [1201] * 5 + [1200] * 20 + [57] + [900, 900, 899] + [1100] * 10
    datagrams = [bytes([i % 256]) * size for i, size in enumerate(sizes)]
    collector.expected = len(datagrams) + 1
    try:
        SegmentedSender(sender).send(
            [memoryview(d) for d in datagrams], receiver.get_extra_info("sockname")
        )
        sender.sendto(b"\x00\x01stun", receiver.get_extra_info("sockname"))
        await asyncio.wait_for(collector.arrived.wait(), 5)
    finally:
        sender.close()
        receiver.close()
    assert not collector.errors
    return [*datagrams, b"\x00\x01stun"], collector.datagrams, stats, taken


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_GRO is Linux's")
async def test_segmented_runs_arrive_whole_and_leave_as_their_datagrams() -> None:
    sent, received, stats, taken = await receive(segmented=True)
    assert taken
    assert received == sent
    assert stats.datagrams == len(sent)
    assert stats.reads < len(sent) and stats.coalesced >= len(sent) - 5  # runs came whole


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_GRO is Linux's")
async def test_datagrams_sent_one_by_one_arrive_as_they_were() -> None:
    sent, received, stats, taken = await receive(segmented=False)
    assert taken
    assert received == sent
    assert stats.reads == stats.datagrams == len(sent) and stats.coalesced == 0


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_GRO is Linux's")
async def test_a_reader_may_take_a_run_whole() -> None:
    taken_runs: list[int] = []
    collector: Collector | None = None

    def take_run(run: bytes, segment: int, addr: Any) -> int:
        """Takes the coalesced runs (as the counting receiver does), in arrival order."""
        assert collector is not None
        if not segment or len(run) <= segment:
            return 0  # a lone datagram: the protocol's
        datagrams = split(run, segment)
        taken_runs.append(len(datagrams))
        collector.datagrams.extend(datagrams)
        if len(collector.datagrams) >= collector.expected:
            collector.arrived.set()
        return len(datagrams)

    def collect(c: Collector) -> Collector:
        nonlocal collector
        collector = c
        return c

    sent, received, stats, taken = await receive(segmented=True, take_run=take_run, made=collect)
    assert taken and taken_runs  # runs came, and none reached the protocol whole
    assert received == sent  # what was taken and what was not, in order, is what was sent
    assert stats.datagrams == len(sent)  # taken or not, every datagram counted once


async def test_a_transport_without_a_socket_is_left_alone() -> None:
    class Relay:  # as aioice's TURN transport: no socket of its own
        def is_closing(self) -> bool:
            return False

    assert not read_coalesced(Relay(), lambda d, a: None, lambda e: None, GroStats())  # type: ignore[arg-type]


@pytest.mark.skipif(sys.platform != "linux", reason="SO_TIMESTAMPNS and UDP_GRO are Linux's")
async def test_each_read_is_handed_on_with_when_the_kernel_received_it() -> None:
    """A reader that comes late (its loop was busy 300 ms) still sees when the datagrams
    arrived, on time.monotonic()'s clock; outside a read the clock says now."""
    loop = asyncio.get_running_loop()
    receiver, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    clock = ReadClock()
    seen: list[tuple[float | None, float]] = []  # (the stamp handed on, when it was read)

    def received(data: bytes, addr: Any) -> None:
        seen.append((clock.kernel_ms, time.monotonic() * 1000.0))
        collector.datagram_received(data, addr)

    stats = GroStats()
    assert read_coalesced(receiver, received, collector.errors.append, stats, None, clock)
    # the kernel turns receive stamps on for the host in deferred work: until it has, a datagram
    # is stamped when read (what a harness's first packets may get)
    await asyncio.sleep(0.2)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        collector.expected = 3
        sent_ms = time.monotonic() * 1000.0
        for _ in range(3):
            sock.sendto(b"\x80" * 200, receiver.get_extra_info("sockname"))
        time.sleep(0.3)  # the loop is busy: nothing is read yet
        await asyncio.wait_for(collector.arrived.wait(), 5)
    finally:
        sock.close()
        receiver.close()
    assert len(seen) == 3 and stats.stamped == stats.reads == 3
    for stamp, read in seen:
        assert stamp is not None
        assert sent_ms <= stamp < sent_ms + 100  # when it came, not when it was read
        assert read >= sent_ms + 300
    assert clock.kernel_ms is None  # after the reads, nothing is left standing
    before = time.monotonic() * 1000.0
    assert before <= clock.now_ms() <= time.monotonic() * 1000.0


def test_a_read_without_a_stamp_has_none() -> None:
    assert receive_time_ns([(17, 104, b"\0\0\0\0")]) is None
    stamp = struct.pack("@ll", 1_700_000_000, 250_000_000)
    assert (
        receive_time_ns([(socket.SOL_SOCKET, SO_TIMESTAMPNS, stamp)]) == 1_700_000_000_250_000_000
    )


@pytest.mark.skipif(sys.platform != "linux", reason="SO_RXQ_OVFL and UDP_GRO are Linux's")
async def test_what_a_full_receive_buffer_dropped_is_counted() -> None:
    """A reader that fell behind (its loop busy while 300 datagrams came into a small buffer)
    hears from the kernel how many it lost: what arrived and what was dropped is what was sent."""
    loop = asyncio.get_running_loop()
    receiver, collector = await loop.create_datagram_endpoint(
        Collector, local_addr=("127.0.0.1", 0)
    )
    receiver.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
    stats = GroStats()
    assert read_coalesced(receiver, collector.datagram_received, collector.errors.append, stats)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)  # one datagram a packet, no runs
    sent = 300
    try:
        for i in range(sent):
            sock.sendto(bytes([i % 256]) * 1000, receiver.get_extra_info("sockname"))
        collector.expected = sent  # never reached: this only waits for the reads to end
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                await collector.arrived.wait()
        sock.sendto(b"\x00\x01last", receiver.get_extra_info("sockname"))  # a read after them
        await asyncio.sleep(0.1)
    finally:
        sock.close()
        receiver.close()
    received = len(collector.datagrams) - 1
    assert 0 < received < sent and stats.dropped > 0
    assert received + stats.dropped == sent


def test_a_read_without_a_drop_count_dropped_nothing() -> None:
    assert drop_count([(17, 104, b"\0\0\0\0")]) == 0
    count = struct.pack("=I", 7)
    assert drop_count([(socket.SOL_SOCKET, SO_RXQ_OVFL, count)]) == 7


class RefusesGro:
    """A socket as a sandboxed kernel (gVisor's, on the lent GPU machines and GKE Sandbox)
    may give one: `UDP_GRO` refused, everything else the real socket's."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.asked: list[tuple[int, int]] = []

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.asked.append((level, option))
        if (level, option) == (SOL_UDP, UDP_GRO):
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")
        self._sock.setsockopt(level, option, value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@pytest.mark.skipif(sys.platform != "linux", reason="UDP_GRO is Linux's")
async def test_a_socket_that_refuses_gro_keeps_asyncio_reading_every_datagram() -> None:
    """Nothing is half set up: no stamps asked for, the transport's own reader kept, and
    segmented runs still arrive as the datagrams they were (the kernel cuts them)."""
    refusing: list[RefusesGro] = []

    def made(collector: Collector) -> None:
        transport = collector.transport
        assert transport is not None
        real = transport._sock  # type: ignore[attr-defined]
        refusing.append(RefusesGro(real))
        transport._sock = refusing[0]  # type: ignore[attr-defined]  # as read_coalesced sees it

    sent, received, stats, taken = await receive(segmented=True, made=made)
    assert not taken
    assert refusing[0].asked == [(SOL_UDP, UDP_GRO)]  # and then nothing more
    assert received == sent
    assert stats.reads == stats.datagrams == 0  # asyncio read them, not read_coalesced
