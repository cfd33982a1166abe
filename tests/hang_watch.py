"""A watchdog for the run itself: a test or an exit that hangs ends the run with every stack.

pytest-timeout's signal method cannot interrupt a test stuck in C code (a decoder's loop, a lock
taken with the GIL held), and nothing bounds the interpreter's exit, which waits for every
non-daemon thread. Past its deadline this prints the stuck stage and each thread's stack to the
real stderr (pytest's capture suspended, or what it holds is lost) and exits 1: a failure that
names the hang, instead of CI's clock running out with nothing printed.

A test stuck in an await shows pytest-timeout only the event loop idling in `select`: which
task waits, and on what, is in no thread's stack. So `TASKS_BEFORE_S` before a test's own
timeout the watchdog also writes every running event loop's tasks with their stacks to the
test's stderr (captured, so pytest shows them with the timeout's failure).
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import sys
import threading
import time
from collections.abc import Generator

import pytest

# past a test's own timeout: stuck where pytest-timeout can't reach it
MARGIN_S = float(os.environ.get("HANG_WATCH_MARGIN_S", "120"))
EXIT_GRACE_S = MARGIN_S  # the interpreter's exit (joining threads) after the last test
TASKS_BEFORE_S = float(os.environ.get("HANG_WATCH_TASKS_BEFORE_S", "5"))
_WATCH = pytest.StashKey["HangWatch"]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_WATCH] = HangWatch(config)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    marker = item.get_closest_marker("timeout")
    own = marker.args[0] if marker and marker.args else item.config.getini("timeout")
    watch = item.config.stash[_WATCH]
    timeout = float(own or 180)
    watch.arm(
        timeout + MARGIN_S, item.nodeid, tasks_after=max(timeout - TASKS_BEFORE_S, timeout / 2)
    )
    try:
        yield
    finally:
        watch.cancel()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # a pytest-xdist worker that is done waits, alive, for the slowest of the others: its exit
    # is the controller's to bound (xdist ends its workers), and the controller's is watched
    # here. `workerinput` is set on a worker's config only; the environment would also reach
    # a pytest that a test starts.
    if hasattr(config, "workerinput"):
        return
    if _WATCH in config.stash:
        config.stash[_WATCH].arm(EXIT_GRACE_S, "the interpreter's exit after the tests")


class HangWatch:
    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._deadline = float("inf")
        self._tasks_at = float("inf")  # when to write the running loops' tasks
        self._what = ""
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="hang-watch", daemon=True).start()

    def arm(self, seconds: float, what: str, tasks_after: float = float("inf")) -> None:
        with self._lock:
            now = time.monotonic()
            self._deadline, self._what = now + seconds, what
            self._tasks_at = now + tasks_after

    def cancel(self) -> None:
        with self._lock:
            self._deadline = self._tasks_at = float("inf")

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            with self._lock:
                now = time.monotonic()
                expired = now > self._deadline
                tasks = now > self._tasks_at
                if tasks:
                    self._tasks_at = float("inf")  # once a test
                what = self._what
            if tasks:
                write_tasks(what)
            if expired:
                self._end(what)

    def _end(self, what: str) -> None:
        capture = self._config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            try:
                capture.suspend_global_capture(in_=False)
            except Exception:  # the stacks matter more than a clean capture state
                pass
        sys.stderr.write(f"\nhang-watch: {what} is stuck; every thread's stack:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)


def write_tasks(what: str) -> None:
    """Every running event loop's tasks and where each waits, to stderr (from this thread: a
    read of another thread's loop, good enough for a look; retried if the set changes)."""
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]
    out = sys.stderr
    out.write(f"\nhang-watch: {what} is near its timeout; its event loops' tasks:\n")
    for loop in loops:
        if not loop.is_running():
            continue
        for _ in range(5):
            try:
                tasks = list(asyncio.all_tasks(loop))
                break
            except RuntimeError:  # the set changed as it was read
                continue
        else:
            tasks = []
        for task in tasks:
            out.write(f"--- {task!r}\n")
            try:
                task.print_stack(limit=12, file=out)
            except Exception as exc:  # a task that ended meanwhile
                out.write(f"    (no stack: {exc!r})\n")
    out.flush()
