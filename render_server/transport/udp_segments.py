"""Many datagrams in one system call: UDP generic segmentation offload (Linux's `UDP_SEGMENT`).

A frame's packets leave in bursts of the pacer's budget, tens of datagrams at 4K. Each
`sendto` is one system call with its own trip through the socket layer; with `UDP_SEGMENT` one
`sendmsg` carries a run of datagrams of one size (the last may be shorter) and the kernel (or
the NIC) cuts it into the same datagrams on the wire, so the receiver sees exactly what
separate sends would have made. aiortc's H.264 packetizer cuts a NAL into fragments that
differ by at most one byte, larger first, so a NAL's packets make two runs at most.

Where the socket or its route refuses segmentation (no checksum offload on the device gives
EIO, a route whose MTU is under the segment gives EINVAL), the run is sent datagram by
datagram and the socket is not asked again; a socket whose buffer is full, or an asyncio
transport that already holds queued datagrams, gets the rest through the transport's own
`sendto`, which keeps their order.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any, Final

log = logging.getLogger(__name__)

SOL_UDP: Final = 17
UDP_SEGMENT: Final = 103  # linux/udp.h
MAX_SEGMENTS: Final = 64  # the kernel's UDP_MAX_SEGMENTS
MAX_RUN_BYTES: Final = 65_000  # under an IPv4 datagram's 65,507 bytes of payload
_REFUSED: Final = frozenset({errno.EIO, errno.EINVAL, errno.EMSGSIZE, errno.ENOPROTOOPT})


def segment_runs(
    sizes: Sequence[int], max_segments: int = MAX_SEGMENTS, max_bytes: int = MAX_RUN_BYTES
) -> list[tuple[int, int]]:
    """`(start, end)` of each run of consecutive datagrams that one segmented send can carry:
    all of the first's size but the last, which may be shorter."""
    runs: list[tuple[int, int]] = []
    start, count = 0, len(sizes)
    while start < count:
        size, end, total = sizes[start], start + 1, sizes[start]
        while end < count and end - start < max_segments and total + sizes[end] <= max_bytes:
            following = sizes[end]
            if following > size:
                break
            end, total = end + 1, total + following
            if following < size:
                break  # a shorter datagram ends the run
        runs.append((start, end))
        start = end
    return runs


class SegmentedSender:
    """Datagrams to one address through one asyncio datagram transport, in runs where the
    socket takes them (`segmented` counts the datagrams that went in runs of two or more)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        sock = getattr(transport, "_sock", None)  # asyncio's selector transport (CPython 3.11+)
        usable = (
            sys.platform == "linux"
            and isinstance(sock, socket.socket)
            and sock.type == socket.SOCK_DGRAM
            and sock.family in (socket.AF_INET, socket.AF_INET6)
        )
        self._sock: socket.socket | None = sock if usable else None
        self.segmented = 0
        self.refused: int | None = None  # the errno that turned segmentation off, if one did

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, datagrams: Sequence[bytes | memoryview], address: Any) -> None:
        """Datagrams in order; views are read before this returns (a transport that must
        queue them copies them, and TURN's gets bytes)."""
        transport, sock = self.transport, self._sock
        if sock is None:
            for data in datagrams:
                transport.sendto(bytes(data), address)
            return
        for start, end in segment_runs([len(data) for data in datagrams]):
            if end - start == 1 or transport.get_write_buffer_size() or self._sock is None:
                for data in datagrams[start:end]:
                    transport.sendto(data, address)
                continue
            run = datagrams[start:end]
            option = struct.pack("=H", len(run[0]))
            try:
                sock.sendmsg(run, [(SOL_UDP, UDP_SEGMENT, option)], 0, address)
            except OSError as exc:
                if exc.errno in _REFUSED:
                    self._refuse(exc)
                # full buffer (the transport queues them), or an error it reports its own way
                for data in run:
                    transport.sendto(data, address)
                continue
            self.segmented += len(run)

    def _refuse(self, error: OSError) -> None:
        self._sock, self.refused = None, error.errno
        log.info("udp_segments.refused", extra={"error": str(error)[:200]})
