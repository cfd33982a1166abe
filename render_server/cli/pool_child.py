"""A child process of a worker pool (`--processes N`), started by worker/pool_children.py as
`python -m render_server.cli.pool_child FD`: it serves its share of the worker's slots with a
WorkerService of its own and talks to its parent over the socket `FD` (worker/pool_wire.py).

It ends when that socket closes (the parent stopped or died) or, should the parent die without
closing it, on the SIGTERM the kernel sends then. Ctrl+C in a terminal reaches the whole process
group: the child leaves it to the parent, which drains and then closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from dataclasses import replace
from typing import Any, Final

from render_server import logs
from render_server.config import ServerConfig, WorkerConfig
from render_server.loop_lag import watch_event_loop
from render_server.memory import fix_mmap_threshold, settle_heap, size_datagram_reads
from render_server.metrics import Metrics
from render_server.protocol.worker import ToSignaling
from render_server.worker.pool_wire import (
    CLOSE_ALL,
    HANDOFF,
    MESSAGE,
    READY,
    REPLY,
    SETUP,
    STATUS,
    read_frame,
    write_frame,
)
from render_server.worker.service import WorkerService

log = logging.getLogger(__name__)

STATUS_S: Final = 1.0
PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """SIGTERM when the parent dies (Linux); elsewhere the closed socket alone ends the child."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class _ChildFields(logging.Filter):
    """`child=N` on every log line of this process."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index

    def filter(self, record: logging.LogRecord) -> bool:
        record.child = self.index
        return True


async def serve_child(fd: int) -> None:
    reader, writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
    setup = await read_frame(reader)
    if setup is None or setup["kind"] != SETUP:
        raise ConnectionError("the worker pool's first frame is not its setup")
    config: ServerConfig | WorkerConfig = setup["config"]
    index: int = setup["index"]
    logs.configure(setup["log_level"], config.log_format)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_ChildFields(index))

    from render_server.cli.process import start_local_worker  # loads aiortc, numba, trimesh

    metrics = Metrics()
    config = replace(config, slots=setup["slots"], processes=1)
    worker = await start_local_worker(
        setup["worker_id"], config, metrics, setup.get("scene"),
        scene_source=setup.get("scene_source"),
    )  # fmt: skip

    async def send(message: ToSignaling) -> None:
        if writer.is_closing():  # the parent is gone: nobody to tell
            return
        write_frame(writer, REPLY, message=message)
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    service = WorkerService(worker, send)
    settle_heap()  # warmed up: what is loaded now would make each full collection a freeze
    watch_event_loop()  # and from now on a late timer is a stream's wait (loop_lag.py)
    write_frame(writer, READY, pid=os.getpid())
    await writer.drain()
    tasks: set[asyncio.Task[Any]] = set()

    def spawn(job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def report() -> None:
        while True:
            frames = sum(s.frames for s in service.sessions.values())
            write_frame(writer, STATUS, metrics=metrics.render(), frames=frames)
            await writer.drain()
            await asyncio.sleep(STATUS_S)

    spawn(report())
    try:
        while (frame := await read_frame(reader)) is not None:
            kind = frame["kind"]
            if kind == MESSAGE:
                service.submit(frame["message"])
            elif kind == HANDOFF:
                sid = frame["session_id"]
                spawn(service.handoffs() if sid is None else service.handoff(sid))
            elif kind == CLOSE_ALL:
                spawn(service.close_all(frame["reason"]))
    except ConnectionError:
        pass  # the parent is gone
    finally:
        log.info("worker.child_stopping", extra={"sessions": len(service.sessions)})
        await service.close_all("worker_stopping")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await service.cancel()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python -m render_server.cli.pool_child FD (started by a worker)",
              file=sys.stderr)  # fmt: skip
        return 2
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() == 1:  # the parent died before the line above: nobody to serve
        return 1
    fix_mmap_threshold()
    size_datagram_reads()
    try:
        asyncio.run(serve_child(int(argv[0])))
    except Exception as exc:  # at start (a scene, a backend): the parent reports the exit
        print(f"render-server: worker child: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
