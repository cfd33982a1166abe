"""Messages from one worker → the registry and the channels of its sessions' browsers.

Used by the `/worker` socket handler and by `serve`'s embedded worker (`local_worker_link.py`)
alike. A worker may only speak for sessions the registry says it holds, whatever ids it writes:
anything else is refused and logged. A session that moved to another worker is still held by
the old one until it says it has closed it; that `session.ended` frees the old slot and is not
news to the session.
"""

from __future__ import annotations

import logging
from typing import Any

from render_server.logs import session_logger
from render_server.protocol.bus import Assigned, WorkerLost
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.viewers import ViewerReply
from render_server.protocol.worker import (
    PROCESS_LOST,
    CloseSession,
    SessionReply,
    WorkerSessionEnded,
)
from render_server.signaling.audit import audit
from render_server.signaling.context import SignalingContext
from render_server.signaling.state.registry import Claim, WorkerInfo

log = logging.getLogger(__name__)

REGISTRY_LEASE_S = 20.0  # a claim or queue place not renewed for this long is freed


class WorkerRelay:
    def __init__(self, ctx: SignalingContext, worker_id: str) -> None:
        self.ctx = ctx
        self.worker_id = worker_id

    async def register(self, info: WorkerInfo, sessions: tuple[str, ...] = ()) -> None:
        """Add the worker (again: a reconnection keeps the sessions it still streams); queued
        sessions it can take are placed on it at once, and it closes the sessions that were
        placed elsewhere meanwhile."""
        result = await self.ctx.registry.register(info, list(sessions), lease_s=REGISTRY_LEASE_S)
        await self._close_strays(result.stray)
        await publish_assignments(self.ctx, result.served)

    async def heartbeat(
        self, info: WorkerInfo, load: dict[str, Any], sessions: tuple[str, ...] | None
    ) -> None:
        """Note the worker alive and reconcile: claims it does not serve are freed (their
        sessions placed again), sessions nobody placed on it are closed."""
        registry = self.ctx.registry
        result = await registry.heartbeat(
            info.worker_id, load, None if sessions is None else list(sessions),
            claim_grace_s=self.ctx.config.open_timeout_s + self.ctx.config.heartbeat_timeout_s,
        )  # fmt: skip
        if not result.known:
            # expired while still connected (a stall, or Redis lost its data): start afresh
            log.warning("worker.re_register", extra={"worker": info.worker_id})
            await self.register(info, sessions or ())
            return
        await self._close_strays(result.stray)
        if result.released:
            await tell_lost(self.ctx, self.worker_id, result.released, "not_served")
        await publish_assignments(self.ctx, result.served)

    async def from_worker(self, reply: SessionReply | ViewerReply) -> None:
        """What the worker says about one of its sessions (or to one of a session's viewers);
        ProtocolError if it is not its."""
        sid = reply.session_id
        registry = self.ctx.registry
        holder = await registry.worker_of(sid)
        # the holder's replies go on at one read; a worker the session moved away from still
        # holds its old slot until it says the session ended there
        if holder != self.worker_id and not await registry.holds(self.worker_id, sid):
            if holder is not None:  # speaking for another's session
                audit("audit.worker.forged", worker=self.worker_id, session=sid)
                raise ProtocolError(ErrorCode.FORBIDDEN, "that session is not on this worker")
            return  # a late message for a session already released: nothing to route
        if isinstance(reply, ViewerReply):
            # a worker a session moved away from still tells its viewers they must go
            await self.ctx.channels.to_viewer(reply.viewer_id, reply)
        elif isinstance(reply, WorkerSessionEnded):
            await self._ended(sid, reply.reason, holder)
        elif holder == self.worker_id:  # from an old worker of a moved session: no news
            await self.ctx.channels.to_session(sid, reply)

    async def session_ended(self, sid: str, reason: str) -> None:
        """Free the session's slot here; its holder hears of it unless the session moved to
        another worker."""
        await self._ended(sid, reason, await self.ctx.registry.worker_of(sid))

    async def _ended(self, sid: str, reason: str, holder: str | None) -> None:
        served = await self.ctx.registry.release(Claim(self.worker_id, sid))
        session_logger(__name__, sid, worker=self.worker_id).info(
            "session.released", extra={"reason": reason, "moved": holder != self.worker_id}
        )
        if holder == self.worker_id or holder is None:
            # a worker's child process died with the session: placed again, as when a whole
            # worker is lost
            news = WorkerLost(sid, reason) if reason == PROCESS_LOST else None
            await self.ctx.channels.to_session(sid, news or WorkerSessionEnded(sid, reason))
        await publish_assignments(self.ctx, served)

    async def _close_strays(self, sessions: list[str]) -> None:
        for sid in sessions:
            session_logger(__name__, sid, worker=self.worker_id).info("session.stray")
            await self.ctx.channels.to_worker(self.worker_id, CloseSession(sid, "unknown_session"))

    async def lost(self, reason: str) -> None:
        """The worker is gone: its sessions' browsers are told, to be placed elsewhere."""
        claims = await self.ctx.registry.unregister(self.worker_id)
        await tell_lost(self.ctx, self.worker_id, claims, reason)


async def tell_lost(
    ctx: SignalingContext, worker_id: str, claims: list[Claim], reason: str
) -> None:
    audit("audit.worker.lost", worker=worker_id, sessions=len(claims), reason=reason)
    for claim in claims:
        await ctx.channels.to_session(claim.session_id, WorkerLost(claim.session_id, reason))


async def publish_assignments(ctx: SignalingContext, served: list[Claim]) -> None:
    """Waiting sessions that just got a slot: their holders open them on the worker."""
    for claim in served:
        await ctx.channels.to_session(claim.session_id, Assigned(claim.session_id, claim.worker_id))
    if served:
        await ctx.channels.queue_changed()
