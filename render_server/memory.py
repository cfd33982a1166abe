"""The process's memory policy: glibc's mmap threshold fixed at start, and what exists once
the process has started moved out of the garbage collector's sight.

Light on purpose (the standard library only): the server processes (`cli/process.py`) use
both, the load test's harness processes (`tools/loadtest/runner.py`) `settle_heap`."""

from __future__ import annotations

import ctypes
import gc

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value


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


def settle_heap() -> None:
    """Move everything made while starting out of the garbage collector's sight.

    A full collection walks every object alive: numba, trimesh and aiortc leave ~160k of them
    at import, which made each full collection stop the event loop for 60-110 ms, a visible
    freeze of every stream (a load test saw it ~1.5 s after its streams started). What exists
    before serving is never garbage, so it is frozen out of the collector's work."""
    gc.collect()
    gc.freeze()
