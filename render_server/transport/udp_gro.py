"""Many datagrams in one read: UDP generic receive offload (Linux's `UDP_GRO`).

The receiving half of `udp_segments`. asyncio reads a datagram socket one `recvfrom` per
readiness event, so every datagram costs a trip through the selector, the transport and a
system call; and a sender's segmented run (`UDP_SEGMENT`) is cut back into datagrams in the
kernel before the socket sees it. With `UDP_GRO` on the socket, the kernel hands over such a
run (and datagrams it merged on the way) whole, with the segment size in a control message,
and this reader cuts it into the same datagrams the sender wrote. It also reads the socket
until it is empty (up to `READS_PER_WAKE` reads) before going back to the selector.

Only for a socket whose protocol is fed here: an asyncio transport reading it with `recvfrom`
would get a run as one datagram. Where the kernel refuses the option nothing is changed.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from render_server.transport.udp_segments import SOL_UDP

UDP_GRO: Final = 104  # linux/udp.h
READ_SIZE: Final = 65_536  # the largest run the kernel hands over in one read
READS_PER_WAKE: Final = 64  # then the other sockets' turn
_ANCILLARY: Final = socket.CMSG_SPACE(4)
_SEGMENT: Final = struct.Struct("=i")


@dataclass
class GroStats:
    reads: int = 0  # recvmsg calls that returned data
    datagrams: int = 0  # datagrams handed to the protocol
    coalesced: int = 0  # of them, those that came in a read with others


def split(data: bytes, segment: int) -> list[bytes]:
    """The datagrams of a run of `segment`-byte datagrams (the last may be shorter)."""
    if segment <= 0 or len(data) <= segment:
        return [data]
    return [data[i : i + segment] for i in range(0, len(data), segment)]


def segment_size(ancillary: list[tuple[int, int, bytes]]) -> int:
    """The segment size of a coalesced read, 0 for a plain datagram."""
    for level, kind, value in ancillary:
        if level == SOL_UDP and kind == UDP_GRO and len(value) >= _SEGMENT.size:
            return int(_SEGMENT.unpack_from(value)[0])
    return 0


def read_coalesced(
    transport: asyncio.DatagramTransport,
    received: Callable[[bytes, Any], None],
    on_error: Callable[[Exception], None],
    stats: GroStats,
    take_run: Callable[[bytes, int, Any], int] | None = None,
) -> bool:
    """Feed what `transport`'s socket receives to `received(datagram, addr)`, run by run,
    instead of the transport's own reads: True where the socket took `UDP_GRO` (the
    transport's reader is then replaced), False where nothing changed.

    `take_run(run, segment, addr)`, where given, sees each read whole first (`segment`: its
    datagrams' size, 0 for a lone datagram) and returns how many datagrams it took, all
    of them or 0: a reader that only counts need not cut the run into datagrams."""
    sock: socket.socket | None = getattr(transport, "_sock", None)  # asyncio's selector transport
    loop = asyncio.get_running_loop()
    add_reader = getattr(loop, "_add_reader", None)  # the selector loop's: the fd is taken
    if sock is None or add_reader is None or transport.is_closing():
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    recvmsg = sock.recvmsg

    def ready() -> None:
        for _ in range(READS_PER_WAKE):
            try:
                data, ancillary, _flags, addr = recvmsg(READ_SIZE, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                on_error(exc)
                return
            stats.reads += 1
            segment = segment_size(ancillary)
            if take_run is not None:
                taken = take_run(data, segment, addr)
                if taken:
                    stats.datagrams += taken
                    stats.coalesced += taken if taken > 1 else 0
                    continue
            datagrams = split(data, segment)
            stats.datagrams += len(datagrams)
            if len(datagrams) > 1:
                stats.coalesced += len(datagrams)
            for datagram in datagrams:
                received(datagram, addr)

    add_reader(sock.fileno(), ready)  # replaces the transport's; its close removes this one
    return True
