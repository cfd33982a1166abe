"""CPU time read from /proc: of a whole process, or of one of this process's threads.

One read of `/proc/.../stat` costs a few microseconds; a clock read per frame costs ~35 µs in a
VM, so the per-session figure is read once a second from here instead.
"""

from __future__ import annotations

import os

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_seconds(path: str) -> float | None:
    try:
        with open(path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process `pid` (all its threads); None where /proc has no such."""
    return _stat_cpu_seconds(f"/proc/{pid}/stat")


def process_cpu_seconds_or_raise(pid: int) -> float:
    """`process_cpu_seconds`, where a missing figure is an error (RuntimeError): for a
    measurement that cannot go on without it."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"no CPU time for process {pid} (no /proc, or it has exited)")
    return seconds


def thread_cpu_seconds(native_id: int) -> float | None:
    """User + system CPU of this process's thread `native_id` (threading.get_native_id())."""
    return _stat_cpu_seconds(f"/proc/self/task/{native_id}/stat")


def descendants(pid: int) -> list[int]:
    """The live processes under `pid` (children, their children...), from /proc."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        for task in _tasks(parent):
            try:
                with open(f"/proc/{parent}/task/{task}/children") as children:
                    kids = [int(k) for k in children.read().split()]
            except OSError:
                continue
            found += kids
            queue += kids
    return found


def _tasks(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def tree_cpu_seconds_or_raise(pid: int) -> float:
    """CPU of `pid` and of every live process under it (a worker pool's children). A child
    that exited within a measured window takes its CPU with it: the window should have none."""
    total = process_cpu_seconds_or_raise(pid)
    for child in descendants(pid):
        total += process_cpu_seconds(child) or 0.0
    return total
