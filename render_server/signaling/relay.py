"""Messages from one worker → the registry and the channels of its sessions' browsers.

Used by the `/worker` socket handler and by `serve`'s embedded worker (`local_worker_link.py`)
alike. A worker may only speak for sessions the registry says it holds, whatever ids it writes:
anything else is refused and logged.
"""

from __future__ import annotations

import logging
from typing import Any

from render_server.logs import session_logger
from render_server.protocol.bus import Assigned, WorkerLost
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.worker import SessionReply, WorkerSessionEnded
from render_server.signaling.audit import audit
from render_server.signaling.context import SignalingContext
from render_server.signaling.state.registry import Claim, WorkerInfo

log = logging.getLogger(__name__)


class WorkerRelay:
    def __init__(self, ctx: SignalingContext, worker_id: str) -> None:
        self.ctx = ctx
        self.worker_id = worker_id

    async def register(self, info: WorkerInfo) -> None:
        """Add the worker; queued sessions it can take are placed on it at once."""
        await publish_assignments(self.ctx, await self.ctx.registry.register(info))

    async def heartbeat(self, info: WorkerInfo, load: dict[str, Any]) -> None:
        if not await self.ctx.registry.heartbeat(info.worker_id, load):
            # expired while still connected (a stall): its sessions went elsewhere; start afresh
            log.warning("worker.re_register", extra={"worker": info.worker_id})
            await self.register(info)

    async def from_worker(self, reply: SessionReply) -> None:
        """What the worker says about one of its sessions; ProtocolError if it is not its."""
        sid = reply.session_id
        owner = await self.ctx.registry.worker_of(sid)
        if owner != self.worker_id:
            if owner is not None:  # a worker speaking for another worker's session
                audit("audit.worker.forged", worker=self.worker_id, session=sid)
                raise ProtocolError(ErrorCode.FORBIDDEN, "that session is not on this worker")
            return  # a late message for a session already released: nothing to route
        if isinstance(reply, WorkerSessionEnded):
            await self.session_ended(sid, reply.reason)
            return
        await self.ctx.channels.to_session(sid, reply)

    async def session_ended(self, sid: str, reason: str) -> None:
        served = await self.ctx.registry.release(Claim(self.worker_id, sid))
        session_logger(__name__, sid, worker=self.worker_id).info(
            "session.released", extra={"reason": reason}
        )
        await self.ctx.channels.to_session(sid, WorkerSessionEnded(sid, reason))
        await publish_assignments(self.ctx, served)

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
