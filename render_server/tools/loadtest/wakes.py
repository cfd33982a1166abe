"""A harness process's event loop, waking for its sockets at most once every `interval_s`.

Against the kernel sink (`benchmarks/kernel_sink.py`) a counting harness at 64 × 4K60 gets only
the frames' last packets, about 2,900 a second over 64 sockets, and asyncio wakes for each as it
comes: an `epoll_wait`, a context switch off a server process on the same cores, a pass of the
loop and a drained read, per packet. Waking at most every few milliseconds instead lets each
wake read whatever all the sockets hold by then (the kernel queues it meanwhile), for a
fraction of the switches.

What it does not move:
- timers: a wait shorter than what is left of the interval is a timer's, and ends on time;
- the frames' arrival times: the lean and counting receivers take each read's kernel receive
  stamp (`udp_gro.ReadClock`), which is when the packet came, not when it was read.

What it does move, by up to `interval_s`: anything timed on reading, such as a pong's arrival
(the clock alignment's bound widens by that much at worst, and still holds the true offset)
or the lean receiver's NACKs. aiortc's own receive path (`--receiver full`) cannot use it:
asyncio's datagram transport reads one datagram a wake. On by default only for `--receiver
count`.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Final

# `--receiver count`'s default: the harness of capacity.py's 64 × 4K60 scaling run took 0.23
# cores with it, 0.29 without; at 60 fps a stream's frames are 16.7 ms apart
COUNT_INTERVAL_S: Final = 0.005


class CoalescingSelector(selectors.DefaultSelector):
    """The platform's selector, that waits until `interval_s` after its last return before it
    looks at its sockets again (a wait asked to end sooner ends then: a timer is due)."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.sleeps = 0  # waits it stretched, for the tests
        self._last = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:  # 0: asyncio has callbacks ready, do not hold them
            hold = self._last + self.interval_s - time.monotonic()
            if hold > 0:
                self.sleeps += 1
                if timeout is not None and timeout <= hold:
                    time.sleep(timeout)  # a timer is due first: on time, sockets looked at then
                    timeout = 0
                else:
                    time.sleep(hold)
                    timeout = None if timeout is None else timeout - hold
        try:
            return super().select(timeout)
        finally:
            self._last = time.monotonic()


def loop_factory(interval_s: float) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """`asyncio.Runner`'s loop factory for `interval_s` (None, asyncio's own loop, for 0)."""
    if interval_s <= 0:
        return None
    return lambda: asyncio.SelectorEventLoop(CoalescingSelector(interval_s))
