"""The stop signals of a server process: SIGTERM (an orchestrator's stop) and SIGINT (Ctrl+C)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_stop_signals(handler: Callable[[signal.Signals], object]) -> list[signal.Signals]:
    """Call `handler(sig)` on the running loop for each stop signal; the signals it is installed
    for. None where the loop has no signal support (Windows': Ctrl+C stays the
    KeyboardInterrupt that `cli.process.run_process` ends on) or off the main thread (a
    test's threaded server)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in STOP_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler, sig)
            installed.append(sig)
    return installed
