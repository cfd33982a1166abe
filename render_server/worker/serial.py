"""Runs handlers as tasks, one key's in arrival order, different keys side by side.

A worker must apply one session's offer before its ICE candidates, but a slow session start
(a CUDA renderer loading its kernels) must not hold up every other session's messages.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


class KeyedSerializer:
    def __init__(self) -> None:
        # a key's lock lives while a task holds or waits for it
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._tasks: set[asyncio.Task[None]] = set()

    def submit(self, key: str, job: Callable[[], Awaitable[Any]]) -> None:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        task = asyncio.get_running_loop().create_task(self._run(lock, job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, lock: asyncio.Lock, job: Callable[[], Awaitable[Any]]) -> None:
        async with lock:  # asyncio's locks are fair: waiters acquire in arrival order
            try:
                await job()
            except Exception:
                log.exception("worker.message_failed")

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every job still running or waiting, and wait for them to end."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
