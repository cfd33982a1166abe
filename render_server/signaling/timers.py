"""A session's named timers: one task per name (starting one replaces the one before), each
guarded, so that a timer that fails is logged (an outage of the shared state without a
traceback) instead of dying silently."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from render_server.logs import SessionLogger
from render_server.signaling.faults import is_outage


class Timers:
    def __init__(self, log: SessionLogger) -> None:
        self.log = log
        self._tasks: dict[str, asyncio.Task[object]] = {}

    def start(self, name: str, work: Coroutine[Any, Any, object]) -> None:
        self.cancel(name)
        # the coroutine is the task's own (not wrapped): one cancelled before its first step
        # is still closed properly
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(lambda done: self._done(name, done))
        self._tasks[name] = task

    def cancel(self, name: str) -> None:
        """Cancel a timer, unless it is the task running this (it is ending on its own)."""
        task = self._tasks.pop(name, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def cancel_all(self) -> None:
        for name in list(self._tasks):
            self.cancel(name)

    def _done(self, name: str, task: asyncio.Task[object]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is None:
            return
        if is_outage(exc):
            self.log.warning("session.timer_failed", extra={"timer": name, "error": repr(exc)})
        else:
            self.log.error("session.timer_failed", extra={"timer": name}, exc_info=exc)
