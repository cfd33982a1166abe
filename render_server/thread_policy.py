"""No thread of ours runs real-time.

SVT-AV1, opened by root, switches the thread that opens it (and so the threads it then starts)
to SCHED_FIFO priority 99: measured with PyAV's libsvtav1 here. A worker's event loop or frame
thread at that priority starves everything else on its cores, the browser and other sessions
included; whatever it starts afterwards (a child process, Chromium in a test) inherits it, and
on a kernel whose real-time throttling misbehaves a busy real-time process stalls the machine.
Every codec open is followed by `demote_realtime_threads`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

_REALTIME: Final = frozenset(
    getattr(os, name) for name in ("SCHED_FIFO", "SCHED_RR") if hasattr(os, name)
)


def demote_realtime_threads() -> int:
    """Put every real-time thread of this process back on the normal scheduler (where the
    platform has per-thread policies: Linux); how many there were."""
    if not _REALTIME or not os.path.isdir("/proc/self/task"):
        return 0
    demoted = 0
    for name in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError):  # a thread that just ended
            tid = int(name)
            if os.sched_getscheduler(tid) in _REALTIME:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                demoted += 1
    return demoted
