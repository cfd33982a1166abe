"""The process's memory policy: glibc's mmap threshold fixed at start, asyncio's datagram reads
sized to a datagram, and what exists once the process has started moved out of the garbage
collector's sight.

Light on purpose (the standard library only): the server processes (`cli/process.py`,
`cli/pool_child.py`) use all three, the load test's harness processes
(`tools/loadtest/runner.py`) `size_datagram_reads` and `settle_heap`."""

from __future__ import annotations

import asyncio.selector_events
import ctypes
import gc
from typing import Any, Final

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value
# a UDP datagram's payload is at most 65,507 bytes over IPv4, 65,527 over IPv6
DATAGRAM_READ_BYTES: Final = 65_536
# asyncio's datagram transport (private): its class attribute `max_size` sizes every read
DATAGRAM_TRANSPORT: Final[Any] = getattr(asyncio.selector_events, "_SelectorDatagramTransport")  # noqa: B009

_frozen_objects = 0  # settle_heap's count


def fix_mmap_threshold() -> None:
    """Keep glibc from raising its mmap threshold as the process runs.

    glibc serves blocks above the threshold with mmap and gives them back when freed, but it
    raises the threshold to the size of the largest such block freed (up to 32 MiB): after the
    first session ends, every later session's frame buffers come from the heap, which
    fragments and never shrinks (RSS grew 294 -> 317 MiB over 160 sessions at 640x360, and
    kept growing). A fixed threshold keeps them in mmap: the same churn stayed at 281 MiB."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: its allocator has its own policy
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


def size_datagram_reads() -> None:
    """Read each datagram of asyncio's datagram transports into a buffer of a datagram's most,
    not 256 KiB.

    The transport reads with `recvfrom(max_size)`, and CPython allocates `max_size` bytes for
    every read before shrinking them to the datagram. 256 KiB is over glibc's mmap threshold
    (fixed or not: the shrunk block it frees never raises it), so each datagram costs an mmap,
    a page fault, an mremap and a munmap: 18.0 us an 80-byte datagram through an endpoint
    here, 5.1 us with 64 KiB (`benchmarks/datagram_reads.py`). aioice's sockets are such
    transports: every RTCP packet, STUN check, data-channel chunk and input move a worker
    receives. 64 KiB holds any UDP datagram whole.

    Checked against CPython 3.11: `_SelectorDatagramTransport.max_size`, a class attribute
    read at each read."""
    DATAGRAM_TRANSPORT.max_size = DATAGRAM_READ_BYTES


def settle_heap() -> None:
    """Move everything made while starting out of the garbage collector's sight.

    A full collection walks every object alive: numba, trimesh and aiortc leave ~160k of them
    at import, which made each full collection stop the event loop for 60-110 ms, a visible
    freeze of every stream (a load test saw it ~1.5 s after its streams started). What exists
    before serving is never garbage, so it is frozen out of the collector's work."""
    global _frozen_objects
    gc.collect()
    gc.freeze()
    _frozen_objects = gc.get_freeze_count()  # counted once: see frozen_objects()


def frozen_objects() -> int:
    """How many objects `settle_heap` has frozen (0 before it ran), as counted when it did.

    `gc.get_freeze_count()` walks the whole frozen list (CPython 3.11 counts the permanent
    generation's linked list): 11 ms for 119k objects here, and a pool child freezes ~210k. A
    child renders its metrics every second on its event loop, so asking there stalled every
    stream of the child for that long each time; the count is a fact about the start, read
    from here instead. (Frozen objects that die later leave the list, so it can only shrink.)"""
    return _frozen_objects
