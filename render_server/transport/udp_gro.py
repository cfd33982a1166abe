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

Each read also carries the kernel's receive time (`SO_TIMESTAMPNS`), handed on in a
`ReadClock`: a load-test client sharing a host with the server it measures reads late whenever
the scheduler runs something else, and timing frames by when Python read them counts those
waits as the server's freezes. The kernel's stamp is when the datagram reached the host, as a
client on a machine of its own would see it (the kernel turns stamping on for the host in
deferred work, so the first datagrams after the first such socket may carry their read time
instead). And each read says how often the kernel dropped at the socket so far (`SO_RXQ_OVFL`;
a coalesced run dropped whole counts once): a reader that fell so far behind that its receive
buffer filled, which a load test must tell from loss on the way.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from render_server.transport.udp_segments import SOL_UDP

UDP_GRO: Final = 104  # linux/udp.h
READ_SIZE: Final = 65_536  # the largest run the kernel hands over in one read
READS_PER_WAKE: Final = 64  # then the other sockets' turn
SO_TIMESTAMPNS: Final = 35  # asm-generic/socket.h (Python names neither it nor its message)
SO_RXQ_OVFL: Final = 40  # asm-generic/socket.h: the socket's drop count with each read
_TIMESPEC: Final = struct.Struct("@ll")  # struct timespec: seconds, nanoseconds (native longs)
_ANCILLARY: Final = socket.CMSG_SPACE(4) * 2 + socket.CMSG_SPACE(_TIMESPEC.size)
_SEGMENT: Final = struct.Struct("=i")
_COUNT: Final = struct.Struct("=I")


@dataclass
class GroStats:
    reads: int = 0  # recvmsg calls that returned data
    datagrams: int = 0  # datagrams handed to the protocol
    coalesced: int = 0  # of them, those that came in a read with others
    stamped: int = 0  # reads that carried the kernel's receive time
    dropped: int = 0  # the kernel's drops at the sockets, buffers full (a run counts once)


@dataclass
class ReadClock:
    """When what is being handed on arrived: the kernel's receive time of the read under way
    (`kernel_ms`, on `time.monotonic()`'s clock, in ms), or now where there is none (a
    datagram that did not come through `read_coalesced`, or a kernel that gave no stamp)."""

    kernel_ms: float | None = None

    def now_ms(self) -> float:
        stamp = self.kernel_ms
        return stamp if stamp is not None else time.monotonic() * 1000.0


def split(data: bytes, segment: int) -> list[bytes]:
    """The datagrams of a run of `segment`-byte datagrams (the last may be shorter)."""
    if segment <= 0 or len(data) <= segment:
        return [data]
    return [data[i : i + segment] for i in range(0, len(data), segment)]


Ancillary = list[tuple[int, int, bytes]]  # recvmsg's control messages: level, type, data


def _control(ancillary: Ancillary, level: int, kind: int, shape: struct.Struct) -> tuple[Any, ...]:
    """The fields of the read's control message of `level` and `kind`, () where it has none."""
    for have_level, have_kind, value in ancillary:
        if have_level == level and have_kind == kind and len(value) >= shape.size:
            return shape.unpack_from(value)
    return ()


def segment_size(ancillary: Ancillary) -> int:
    """The segment size of a coalesced read, 0 for a plain datagram."""
    fields = _control(ancillary, SOL_UDP, UDP_GRO, _SEGMENT)
    return int(fields[0]) if fields else 0


def drop_count(ancillary: Ancillary) -> int:
    """The socket's drops so far as a read tells them (`SO_RXQ_OVFL`; the kernel sends the
    message only once there is one, so none means 0)."""
    fields = _control(ancillary, socket.SOL_SOCKET, SO_RXQ_OVFL, _COUNT)
    return int(fields[0]) if fields else 0


def receive_time_ns(ancillary: Ancillary) -> int | None:
    """The kernel's receive time of a read (`SO_TIMESTAMPNS`, CLOCK_REALTIME, in ns), None
    where the read carried none."""
    fields = _control(ancillary, socket.SOL_SOCKET, SO_TIMESTAMPNS, _TIMESPEC)
    return int(fields[0] * 1_000_000_000 + fields[1]) if fields else None


def read_coalesced(
    transport: asyncio.DatagramTransport,
    received: Callable[[bytes, Any], None],
    on_error: Callable[[Exception], None],
    stats: GroStats,
    take_run: Callable[[bytes, int, Any], int] | None = None,
    clock: ReadClock | None = None,
) -> bool:
    """Feed what `transport`'s socket receives to `received(datagram, addr)`, run by run,
    instead of the transport's own reads: True where the socket took `UDP_GRO` (the
    transport's reader is then replaced), False where nothing changed.

    `take_run(run, segment, addr)`, where given, sees each read whole first (`segment`: its
    datagrams' size, 0 for a lone datagram) and returns how many datagrams it took, all
    of them or 0: a reader that only counts need not cut the run into datagrams.

    `clock`, where given, holds each read's kernel receive time while it is handed on (and
    None again after): where the kernel refuses the stamps, it stays None."""
    sock: socket.socket | None = getattr(transport, "_sock", None)  # asyncio's selector transport
    loop = asyncio.get_running_loop()
    add_reader = getattr(loop, "_add_reader", None)  # the selector loop's: the fd is taken
    if sock is None or add_reader is None or transport.is_closing():
        return False
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
    except OSError:
        return False
    if clock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
    recvmsg = sock.recvmsg
    dropped = 0  # this socket's, as its last read told

    def ready() -> None:
        try:
            read_all()
        finally:
            if clock is not None:
                clock.kernel_ms = None

    def read_all() -> None:
        nonlocal dropped
        # the stamps' clock is CLOCK_REALTIME: this wake's offset puts them on the monotonic one
        offset_ns = time.time_ns() - time.monotonic_ns() if clock is not None else 0
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
            count = drop_count(ancillary)
            if count > dropped:
                stats.dropped += count - dropped
                dropped = count
            if clock is not None:
                stamp = receive_time_ns(ancillary)
                if stamp is None:
                    clock.kernel_ms = None
                else:
                    stats.stamped += 1
                    # never later than now: the offset is read once a wake, not per stamp
                    clock.kernel_ms = min(stamp - offset_ns, time.monotonic_ns()) / 1e6
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
