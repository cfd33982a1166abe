"""Work on a frame's rows in bands, one per core (up to 4), on a pool shared by every session.

A frame's latency, not its CPU cost, is what a designer feels: the per-pixel kernels (shading,
colour conversion) release the GIL, so bands of rows run at once. The calling thread takes the
first band itself, so a session always makes progress however busy the pool is.
RENDER_SERVER_RENDER_BANDS=1 keeps all the work on the calling thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

DEFAULT_BANDS = int(os.environ.get("RENDER_SERVER_RENDER_BANDS", "0")) or min(
    4, os.cpu_count() or 1
)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _band_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, DEFAULT_BANDS), thread_name_prefix="render-band")
        return _pool


def split_rows(height: int, count: int | None = None, step: int = 1) -> list[tuple[int, int]]:
    """`count` (default: DEFAULT_BANDS) bands of rows [start, stop) covering 0..height, each
    starting on a multiple of `step` (2 for 4:2:0 chroma rows)."""
    units = height // step
    count = max(1, min(count or DEFAULT_BANDS, units))
    edges = [round(units * i / count) * step for i in range(count)] + [height]
    return [(edges[i], edges[i + 1]) for i in range(count)]


def run_in_bands(work: Callable[[int, int], None], bands: list[tuple[int, int]]) -> None:
    """`work(start, stop)` for every band: the first on this thread, the others on the pool."""
    others = [_band_pool().submit(work, *band) for band in bands[1:]]
    work(*bands[0])
    for future in others:
        future.result()
