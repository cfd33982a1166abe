"""A worker that serves its sessions from child processes (`--processes N`): the same service
as `WorkerService` towards signaling (one registration, the slots summed, one heartbeat), with
each session placed on the child with the most free slots and its messages routed there.

A child that dies takes its sessions' media with it: each is reported ended with
`PROCESS_LOST`, which signaling treats as a lost worker (the browser is told and the session
placed again, ahead of the queue), and the child is restarted (worker/pool_children.py).
Metrics: each child's /metrics text is merged into this process's, labelled with the child's
index and pid (metrics.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Final

from render_server.protocol.errors import ErrorCode
from render_server.protocol.viewers import (
    SESSION_ENDED,
    ViewerEnded,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewerReply,
    ViewersEnd,
)
from render_server.protocol.worker import (
    PROCESS_LOST,
    CloseSession,
    DrainWorker,
    Heartbeat,
    OpenSession,
    Register,
    Registered,
    SessionReply,
    ToSignaling,
    ToWorker,
    WorkerError,
    WorkerNotice,
    WorkerSessionEnded,
)
from render_server.worker.local import LocalWorker
from render_server.worker.pool_children import Child, WorkerPool
from render_server.worker.pool_wire import CLOSE_ALL, HANDOFF, MESSAGE
from render_server.worker.service import (
    DrainHandler,
    Send,
    SessionService,
    WorkerService,
    new_instance,
)

log = logging.getLogger(__name__)

CLOSE_WAIT_S: Final = 5.0  # close_all waits this long for the children's `session.ended`


def worker_service(
    worker: LocalWorker,
    send: Send,
    labels: tuple[str, ...] = (),
    region: str | None = None,
    pool: WorkerPool | None = None,
) -> SessionService:
    """The service of a worker: its sessions in this process, or in `pool`'s children."""
    if pool is None:
        return WorkerService(worker, send, labels, region)
    return PoolService(pool, worker, send, labels, region)


class PoolService:
    def __init__(
        self,
        pool: WorkerPool,
        worker: LocalWorker,
        send: Send,
        labels: tuple[str, ...] = (),
        region: str | None = None,
    ) -> None:
        """`worker`: this process's own, never warmed up: what it says of the worker
        (capabilities, codecs, slots) and the metrics the children's are merged into."""
        self.pool = pool
        self.worker = worker
        self.send = send
        self.labels = labels
        self.region = region
        self.instance = new_instance()
        self.placed: dict[str, Child] = {}  # session id → the child serving it (or opening it)
        self.draining = False
        self.on_drain: DrainHandler | None = None
        self.changed = asyncio.Event()
        self._last_send: asyncio.Task[None] | None = None
        pool.on_reply, pool.on_lost, pool.on_status = self._reply, self._lost, self._status

    @property
    def sessions(self) -> Mapping[str, object]:
        return self.placed

    @property
    def idle(self) -> bool:
        return not self.placed

    def registration(self) -> Register:
        return Register(
            worker_id=self.worker.worker_id,
            slots=self.worker.slots,
            capabilities={**self.worker.capabilities, "processes": len(self.pool.children)},
            labels=self.labels,
            region=self.region,
            instance=self.instance,
            session_ids=tuple(self.placed),
            draining=self.draining,
        )

    def heartbeat(self) -> Heartbeat:
        load: dict[str, Any] = {"frames": sum(c.frames for c in self.pool.children)}
        return Heartbeat(
            sessions=len(self.placed),
            load=load,
            session_ids=tuple(self.placed),
            draining=self.draining,
        )

    def submit(self, message: ToWorker) -> None:
        if isinstance(message, Registered):
            return  # the agent takes that one itself
        if isinstance(message, DrainWorker):
            if self.on_drain is not None:
                self.on_drain(message.reason, message.deadline_s)
            return
        sid = message.session_id
        child = self.placed.get(sid)
        if child is None and isinstance(message, OpenSession):
            child = self._place(sid)
            if child is None:
                return
        if child is None:
            self._unknown(message)
        else:
            child.send(MESSAGE, message=message)

    async def drain(self) -> None:
        """Nothing waits here: each message went to its child as it came."""

    async def cancel(self) -> None:
        await self.pool.stop()

    async def handoff(self, sid: str) -> None:
        child = self.placed.get(sid)
        if child is not None:
            child.send(HANDOFF, session_id=sid)

    async def handoffs(self) -> None:
        for child in self.pool.children:
            child.send(HANDOFF, session_id=None)

    async def close_all(self, reason: str) -> None:
        for child in self.pool.children:
            child.send(CLOSE_ALL, reason=reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_WAIT_S
        while self.placed and loop.time() < deadline:
            self.changed.clear()
            try:
                async with asyncio.timeout(deadline - loop.time()):
                    await self.changed.wait()
            except TimeoutError:
                break

    # -- placement and routing ---------------------------------------------------------------

    def _place(self, sid: str) -> Child | None:
        """The child for a new session, or None after refusing it as WorkerService does."""
        # a ready child first; a restarting one's slots wait for it (signaling counts them)
        best = max(self.pool.children, key=lambda c: (c.free > 0 and c.ready, c.free))
        if self.draining or best.free <= 0:
            text = "this worker is draining" if self.draining else "this worker has no free slot"
            self._send(WorkerError(sid, ErrorCode.NO_CAPACITY, text))
            self._send(WorkerSessionEnded(sid, ErrorCode.NO_CAPACITY))
            return None
        best.sessions.add(sid)
        self.placed[sid] = best
        self.changed.set()
        log.info("worker.session_placed", extra={"session": sid, "child": best.index})
        return best

    def _unknown(self, message: ToWorker) -> None:
        sid = message.session_id  # type: ignore[union-attr]  # worker requests returned above
        if isinstance(message, ViewerOffer | ViewerIce):  # a viewer of a session not here
            self._send(ViewerEnded(sid, message.viewer_id, SESSION_ENDED, "the session ended"))
        elif isinstance(message, ViewerLeave | ViewersEnd):
            pass  # a page that left needs no answer, nor viewers of a session that is gone
        elif isinstance(message, CloseSession):  # every close is answered, known or not
            self._send(WorkerSessionEnded(sid, message.reason))
        else:
            self._send(WorkerError(sid, ErrorCode.UNKNOWN_SESSION, "no such session"))

    def _reply(self, child: Child, message: object) -> None:
        if isinstance(message, WorkerSessionEnded):
            if self.placed.get(message.session_id) is child:
                del self.placed[message.session_id]
            child.sessions.discard(message.session_id)
            self.changed.set()
        if isinstance(message, SessionReply | ViewerReply | WorkerNotice):
            self._send(message)

    def _lost(self, child: Child, sessions: set[str]) -> None:
        self.worker.metrics.children.pop(child.index, None)  # its counters died with it
        for sid in sessions:
            if self.placed.get(sid) is child:
                del self.placed[sid]
                self._send(WorkerSessionEnded(sid, PROCESS_LOST))
        self.changed.set()

    def _status(self, child: Child, status: dict[str, Any]) -> None:
        self.worker.metrics.children[child.index] = (child.pid, status["metrics"])

    def _send(self, message: ToSignaling) -> None:
        """Replies keep their order: each waits for the one before it."""
        previous = self._last_send

        async def send() -> None:
            if previous is not None:
                await asyncio.gather(previous, return_exceptions=True)
            try:
                await self.send(message)
            except Exception:  # a bug of ours: that reply is lost, not the ones after it
                log.exception("worker.reply_failed")

        self._last_send = asyncio.get_running_loop().create_task(send())


__all__ = ["PoolService", "worker_service"]
