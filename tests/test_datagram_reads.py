"""asyncio's datagram reads sized to a datagram (`memory.size_datagram_reads`): nothing a UDP
socket can carry is cut, and the server and harness processes read that way."""

from __future__ import annotations

import asyncio

import pytest

from render_server.cli.process import run_process
from render_server.memory import DATAGRAM_READ_BYTES, size_datagram_reads
from render_server.memory import DATAGRAM_TRANSPORT as TRANSPORT

LARGEST_IPV4_DATAGRAM = 65_507


@pytest.fixture
def sized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TRANSPORT, "max_size", TRANSPORT.max_size)  # restored after the test
    size_datagram_reads()


class Collector(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.got.put_nowait(data)


@pytest.mark.usefixtures("sized")
async def test_the_largest_datagram_arrives_whole_and_so_do_small_ones() -> None:
    assert TRANSPORT.max_size == DATAGRAM_READ_BYTES < 128 * 1024  # under the mmap threshold
    loop = asyncio.get_running_loop()
    receiver, protocol = await loop.create_datagram_endpoint(Collector, local_addr=("127.0.0.1", 0))
    sender, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, remote_addr=receiver.get_extra_info("sockname")
    )
    try:
        sent = [bytes([i % 251]) * size for i, size in enumerate((LARGEST_IPV4_DATAGRAM, 80, 1))]
        for data in sent:
            sender.sendto(data)
        async with asyncio.timeout(5):
            got = [await protocol.got.get() for _ in sent]
        assert got == sent
    finally:
        sender.close()
        receiver.close()


def test_a_server_process_reads_datagrams_sized_to_a_datagram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(TRANSPORT, "max_size", 256 * 1024)  # asyncio's own, restored after
    seen: list[int] = []

    async def main() -> None:
        seen.append(TRANSPORT.max_size)

    assert run_process(main()) == 0
    assert seen == [DATAGRAM_READ_BYTES]
