"""The child processes of a worker pool (`--processes N`): started, watched and restarted.

Each child owns a share of the worker's slots and everything of its sessions (peer connections,
renderers, encoders), so that sessions spread over every core instead of one event loop and one
GIL. A child talks to this process over a socket pair (worker/pool_wire.py); it ends itself when
that socket closes or this process dies, so no child outlives its worker.

A child that exits, or says nothing for `SILENT_S` (frozen), is killed; its sessions are reported
lost (`on_lost`) and it is started again after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from render_server.worker.pool_wire import (
    READY,
    REPLY,
    SETUP,
    STATUS,
    FrameError,
    read_frame,
    write_frame,
)

log = logging.getLogger(__name__)

SILENT_S: Final = 10.0  # a child sends its status each second; this long without: frozen
START_TIMEOUT_S: Final = 300.0  # the first start compiles the renderer (numba) when uncached
STOP_GRACE_S: Final = 5.0
BACKOFF_START_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
STEADY_S: Final = 60.0  # a child that lived this long restarts without backoff


class ChildStartError(RuntimeError):
    """A child process did not start (it said why on stderr)."""


@dataclass
class Child:
    """One child process as this process knows it."""

    index: int
    slots: int
    pid: int = 0
    ready: bool = False
    sessions: set[str] = field(default_factory=set)
    frames: int = 0  # frames its sessions have sent, from its last status
    restarts: int = 0
    process: asyncio.subprocess.Process | None = None
    writer: asyncio.StreamWriter | None = None
    last_heard: float = 0.0  # time.monotonic()
    # frames for a child that is (re)starting: sent once it is ready
    pending: list[dict[str, Any]] = field(default_factory=list)

    @property
    def free(self) -> int:
        """Its slots not taken; a restarting child's count too (what it is sent waits)."""
        return self.slots - len(self.sessions)

    def send(self, kind: str, **fields: Any) -> None:
        """A frame for the child: written now, or once it is ready."""
        if self.ready and self.writer is not None and not self.writer.is_closing():
            write_frame(self.writer, kind, **fields)
        else:
            self.pending.append({"kind": kind, **fields})

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for frame in pending:
            self.send(**frame)


Replies = Callable[[Child, object], None]  # a child's reply for signaling
Lost = Callable[[Child, set[str]], None]  # a child is gone with these sessions
Status = Callable[[Child, dict[str, Any]], None]


def shares(slots: int, processes: int) -> list[int]:
    """`slots` spread over `processes` children as evenly as can be (none gets zero)."""
    processes = max(1, min(processes, slots))
    base, extra = divmod(slots, processes)
    return [base + (1 if i < extra else 0) for i in range(processes)]


class WorkerPool:
    def __init__(
        self,
        command: Sequence[str],
        setup: dict[str, Any],
        slots: int,
        processes: int,
    ) -> None:
        """`command`: the argv that starts a child (the socket's descriptor is appended);
        `setup`: what each child is told first (config, worker id...), with its index and
        share of the slots added. The service that routes the sessions (worker/pool.py) sets
        the callbacks."""
        self.command = tuple(command)
        self.setup = setup
        self.children = [Child(i, n) for i, n in enumerate(shares(slots, processes))]
        self.on_reply: Replies = _unrouted
        self.on_lost: Lost = lambda child, sessions: None
        self.on_status: Status = lambda child, status: None
        self.stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start every child and wait until each is warmed up; ChildStartError if one fails
        (the others are stopped)."""
        started: list[asyncio.Future[None]] = []
        loop = asyncio.get_running_loop()
        for child in self.children:
            first = loop.create_future()
            started.append(first)
            self._tasks.append(loop.create_task(self._keep(child, first)))
        try:
            await asyncio.gather(*started)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Close every child's socket (it closes its sessions and exits), then wait for them;
        what does not exit in STOP_GRACE_S is killed."""
        self.stopping = True
        for child in self.children:
            if child.writer is not None:
                child.writer.close()
        await asyncio.gather(*(self._reap(c) for c in self.children), return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def pids(self) -> list[int]:
        return [c.pid for c in self.children if c.ready]

    # -- one child's life --------------------------------------------------------------------

    async def _keep(self, child: Child, first: asyncio.Future[None]) -> None:
        """Run `child`, and again whenever it ends, until the pool stops."""
        backoff = BACKOFF_START_S
        while not self.stopping:
            began = time.monotonic()
            try:
                await self._run(child, first)
            except Exception as exc:
                if not first.done():
                    first.set_exception(exc)
                    return
                log.error("worker.child_failed", extra={"child": child.index, "error": str(exc)})
            lost, child.sessions, child.pending = child.sessions, set(), []
            child.ready = False
            if self.stopping:
                return
            self.on_lost(child, lost)
            child.restarts += 1
            backoff = BACKOFF_START_S if time.monotonic() - began > STEADY_S else backoff
            log.warning(
                "worker.child_restarting",
                extra={
                    "child": child.index,
                    "sessions_lost": len(lost),
                    "in_s": backoff,
                    "restarts": child.restarts,
                },
            )
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _run(self, child: Child, first: asyncio.Future[None]) -> None:
        ours, theirs = socket.socketpair()
        try:
            child.process = await asyncio.create_subprocess_exec(
                *self.command, str(theirs.fileno()), pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            theirs.close()
        reader, child.writer = await asyncio.open_connection(sock=ours)
        child.pid = child.process.pid
        child.last_heard = time.monotonic()
        write_frame(child.writer, SETUP, **self.setup, index=child.index, slots=child.slots)
        watchdog = asyncio.get_running_loop().create_task(self._watch(child))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                frame = await read_frame(reader)
            if frame is None or frame["kind"] != READY:
                code = await self._reap(child)
                raise ChildStartError(f"worker child {child.index} exited at start (code {code})")
            child.ready = True
            child.last_heard = time.monotonic()
            log.info("worker.child_ready", extra={"child": child.index, "pid": child.pid})
            child.flush()
            if not first.done():
                first.set_result(None)
            await self._listen(child, reader)
        finally:
            watchdog.cancel()
            child.writer.close()
            code = await self._reap(child)
            if not self.stopping:
                log.warning(
                    "worker.child_exited",
                    extra={"child": child.index, "pid": child.pid, "code": code},
                )

    async def _listen(self, child: Child, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                frame = await read_frame(reader)
            except (FrameError, OSError) as exc:
                log.error("worker.child_bad_frame", extra={"child": child.index, "error": str(exc)})
                return
            if frame is None:
                return
            child.last_heard = time.monotonic()
            try:
                if frame["kind"] == REPLY:
                    self.on_reply(child, frame["message"])
                elif frame["kind"] == STATUS:
                    child.frames = int(frame.get("frames", 0))
                    self.on_status(child, frame)
            except Exception:  # a bug of ours: that frame is lost, not the child
                log.exception("worker.child_frame_failed", extra={"child": child.index})

    async def _watch(self, child: Child) -> None:
        """Kill a child that says nothing for SILENT_S once it is up (stopped, deadlocked)."""
        while True:
            await asyncio.sleep(1.0)
            if child.ready and time.monotonic() - child.last_heard > SILENT_S:
                log.error("worker.child_silent", extra={"child": child.index, "pid": child.pid})
                with contextlib.suppress(ProcessLookupError):
                    if child.process is not None:
                        child.process.kill()
                return

    async def _reap(self, child: Child) -> int | None:
        process = child.process
        if process is None:
            return None
        try:
            async with asyncio.timeout(STOP_GRACE_S):
                return await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            return await process.wait()


def _unrouted(child: Child, message: object) -> None:
    log.warning("worker.child_reply_unrouted", extra={"child": child.index, "reply": message})
