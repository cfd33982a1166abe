"""Work on a frame's rows in bands, on the calling thread and a pool shared by every session.

A frame's latency, not its CPU cost, is what a designer feels: the per-pixel kernels (the
renderer's passes, colour conversion) release the GIL, so bands of rows run at once.

There are more bands than threads (`BANDS_PER_THREAD` per thread), and every thread takes the
next band from a shared counter until none is left. The host's cores are shared with other
processes (a browser decoding the stream, the encoder): with one band per thread, a frame
waited whenever a pool thread was descheduled, holding its band. Now the calling thread,
always running while it renders, does whatever the others do not get to, and the frame waits
at most for the bands already under way. A pool thread that starts late finds nothing to do.

RENDER_SERVER_RENDER_BANDS sets the threads that work on one frame (default: one per core, up
to 4); 1 keeps all the work on the calling thread, in one band.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

THREADS = int(os.environ.get("RENDER_SERVER_RENDER_BANDS", "0")) or min(4, os.cpu_count() or 1)
BANDS_PER_THREAD = 4  # enough that the last band, which others may wait for, is short
DEFAULT_BANDS = THREADS * BANDS_PER_THREAD if THREADS > 1 else 1

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _band_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, THREADS), thread_name_prefix="render-band")
        return _pool


def split_rows(height: int, count: int | None = None, step: int = 1) -> list[tuple[int, int]]:
    """`count` (default: DEFAULT_BANDS) bands of rows [start, stop) covering 0..height, each
    starting on a multiple of `step` (2 for 4:2:0 chroma rows)."""
    units = height // step
    count = max(1, min(count or DEFAULT_BANDS, units))
    edges = [round(units * i / count) * step for i in range(count)] + [height]
    return [(edges[i], edges[i + 1]) for i in range(count)]


class _Bands:
    """One call's bands and who has taken them."""

    def __init__(self, work: Callable[[int, int], None], bands: Sequence[tuple[int, int]]):
        self.work = work
        self.bands = bands
        self.next = 0  # the next band to take
        self.running = 0  # bands taken and not finished
        self.error: BaseException | None = None
        self.idle = threading.Condition(threading.Lock())  # notified when running drops to 0

    def take_all(self) -> None:
        """Do bands until none is left (or one has failed)."""
        while True:
            with self.idle:
                if self.next >= len(self.bands) or self.error is not None:
                    return
                start, stop = self.bands[self.next]
                self.next += 1
                self.running += 1
            try:
                self.work(start, stop)
            except BaseException as error:  # re-raised on the calling thread
                with self.idle:
                    self.error = self.error or error
            finally:
                with self.idle:
                    self.running -= 1
                    if self.running == 0:
                        self.idle.notify_all()

    def wait(self) -> None:
        """Return when no band is under way (the caller has stopped taking them)."""
        with self.idle:
            while self.running:
                self.idle.wait()
        if self.error is not None:
            raise self.error


def run_in_bands(
    work: Callable[[int, int], None],
    bands: Sequence[tuple[int, int]],
    threads: int | None = None,
) -> None:
    """`work(start, stop)` once for every band, in order of taking, on this thread and up to
    `threads` − 1 (default: THREADS − 1) pool threads; returns when all are done. The first
    exception raised by `work` stops the taking of bands and is raised here."""
    job = _Bands(work, bands)
    helpers = min(threads or THREADS, len(bands)) - 1
    if helpers > 0:
        pool = _band_pool()
        for _ in range(helpers):
            pool.submit(job.take_all)
    job.take_all()
    job.wait()
