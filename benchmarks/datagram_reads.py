"""What a datagram costs to receive through asyncio: its stock 256 KiB read against the 64 KiB
read of `memory.size_datagram_reads`, in the same process, in alternating rounds.

    python benchmarks/datagram_reads.py [--rounds 20] [--burst 200] [--size 80]

A real asyncio datagram endpoint on loopback, in a process whose glibc mmap threshold is fixed
as the server's (`memory.fix_mmap_threshold`). Each round: a plain socket sends a burst of
`--burst` datagrams of `--size` bytes (an RTCP receiver report, an input move; the burst fits
the socket's buffer), then the loop runs until the endpoint's protocol has them all; only that
receive is timed, in process CPU time (`time.process_time`). The two read sizes take turns
round by round, so that drift in this shared machine's load falls on both. Printed per side:
datagrams received, CPU seconds, microseconds a datagram; then the ratio stock / ours.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's render_server, installed or not
from render_server.memory import (  # noqa: E402
    DATAGRAM_READ_BYTES,
    DATAGRAM_TRANSPORT,
    fix_mmap_threshold,
)

STOCK_READ_BYTES = DATAGRAM_TRANSPORT.max_size  # asyncio's own, 256 KiB: nothing set it yet
SKB_OVERHEAD = 1024  # what the socket's buffer counts for a datagram beyond its bytes, at most


class Counter(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.count = 0
        self.wanted = 0
        self.done: asyncio.Future[None] | None = None

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.count += 1
        if self.count >= self.wanted and self.done is not None and not self.done.done():
            self.done.set_result(None)


async def receive_burst(protocol: Counter, sender: socket.socket, address: object,
                        burst: int, size: int) -> tuple[int, float]:  # fmt: skip
    """(datagrams, CPU seconds) for one burst read through the endpoint."""
    loop = asyncio.get_running_loop()
    payload = b"\x80" * size
    for _ in range(burst):
        sender.sendto(payload, address)
    before = protocol.count
    protocol.wanted = before + burst
    protocol.done = loop.create_future()
    started = time.process_time()
    async with asyncio.timeout(10):
        await protocol.done
    return protocol.count - before, time.process_time() - started


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Counter, local_addr=("127.0.0.1", 0))
    address = transport.get_extra_info("sockname")
    receiving: socket.socket = transport.get_extra_info("socket")
    receiving.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # the kernel caps it
    room = receiving.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    burst = min(args.burst, room // (args.size + SKB_OVERHEAD))  # a burst must never be dropped
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sides = {"stock 256 KiB": STOCK_READ_BYTES, "ours 64 KiB": DATAGRAM_READ_BYTES}
    totals = {name: [0, 0.0] for name in sides}
    try:
        for round_ in range(args.rounds + 1):  # the first round of each side warms up
            for name, read_bytes in sides.items():
                DATAGRAM_TRANSPORT.max_size = read_bytes
                count, cpu = await receive_burst(protocol, sender, address, burst, args.size)
                if round_:
                    totals[name][0] += count
                    totals[name][1] += cpu
    finally:
        DATAGRAM_TRANSPORT.max_size = STOCK_READ_BYTES
        sender.close()
        transport.close()
    print(f"datagram reads through asyncio, {args.size}-byte datagrams, {args.rounds} rounds "
          f"of {burst} a side, alternating")  # fmt: skip
    per = {}
    for name, (count, cpu) in totals.items():
        per[name] = cpu / count * 1e6
        print(f"  {name:14} {count:8,} datagrams, {cpu:.3f} CPU-s -> {per[name]:.2f} us each")
    stock, ours = per["stock 256 KiB"], per["ours 64 KiB"]
    print(f"  ratio stock / ours, CPU a datagram: {stock / ours:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200, help="datagrams a round and side")
    parser.add_argument("--size", type=int, default=80, help="bytes a datagram")
    fix_mmap_threshold()
    asyncio.run(main(parser.parse_args()))
