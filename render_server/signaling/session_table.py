"""The sessions one signaling replica holds, by id, and the leases it keeps on them.

A replica renews, for every session it holds, the session's record in the store and its claim or
queue place in the registry (owner: this replica). A replica that dies stops renewing: its
records lapse within the store's lease, its claims and queue places within the registry's, and
whoever sweeps first frees them (`app._sweep`). After an outage of the shared state (a Redis
restart), renewing stores the records again and puts queued sessions back at their places.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from render_server.logs import session_logger
from render_server.protocol.bus import QueueChanged
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.requirements import Requirements
from render_server.signaling.audit import audit_refusal
from render_server.signaling.auth import Identity
from render_server.signaling.context import SignalingContext
from render_server.signaling.faults import is_outage
from render_server.signaling.relay import REGISTRY_LEASE_S
from render_server.signaling.session import QUEUED, SessionHandle
from render_server.signaling.state.session_store import (
    SessionCaps,
    SessionRecord,
    hash_token,
    new_resume_token,
)

log = logging.getLogger(__name__)


class SessionTable:
    """The sessions this replica holds, by id: each one's handle, subscribed to its channel."""

    def __init__(self, ctx: SignalingContext) -> None:
        self.ctx = ctx
        self._held: dict[str, SessionHandle] = {}

    def get(self, session_id: str) -> SessionHandle | None:
        return self._held.get(session_id)

    def handles(self) -> list[SessionHandle]:
        return list(self._held.values())

    async def create(
        self, identity: Identity, address: str, requirements: Requirements
    ) -> tuple[SessionHandle, str]:
        """A new session's record, stored and counted, with its handle (not started yet) and
        its resume token (the store keeps only the token's hash); ProtocolError
        `too_many_sessions` when the caller's subject or address is at its cap."""
        token = new_resume_token()
        record = SessionRecord(
            uuid.uuid4().hex, identity.subject, identity.role, hash_token(token), requirements,
            address=address,
        )  # fmt: skip
        config = self.ctx.config
        # anonymous callers all share one subject: only their addresses tell them apart
        per_subject = 0 if identity.anonymous else config.max_sessions_per_subject
        refused = await self.ctx.store.admit(
            record, SessionCaps(per_subject, config.max_sessions_per_address)
        )
        if refused is not None:
            audit_refusal("audit.session.too_many", subject=identity.subject, address=address,
                          cap=refused.cap, held=refused.held, limit=refused.limit)  # fmt: skip
            raise ProtocolError(
                ErrorCode.TOO_MANY_SESSIONS,
                f"this {refused.cap} holds {refused.held} sessions (queue places included), "
                f"the most allowed is {refused.limit}: end one first",
            )
        return SessionHandle(self, record, resume_token=token), token

    def adopt(self, record: SessionRecord) -> SessionHandle:
        """The handle of a session being resumed: this replica's, if it holds it already."""
        handle = self._held.get(record.session_id)
        if handle is None:
            return SessionHandle(self, record)
        handle.record = record  # the new generation, with the resuming token's role
        handle.log = session_logger(__name__, record.session_id, role=record.role)
        return handle

    async def keep_alive(self) -> None:
        """Renew the leases of the sessions held here, for as long as the replica runs."""
        every = min(self.ctx.store.lease_s, REGISTRY_LEASE_S) / 4
        while True:
            await asyncio.sleep(every)
            await self.renew()

    async def renew(self) -> None:
        """One renewal: the records (stored again if the store lost them) and the registry's
        leases (queued sessions that the registry lost are queued again at their places)."""
        ctx = self.ctx
        handles = [h for h in self._held.values() if h.live]
        try:
            await ctx.store.renew([h.record for h in handles])
            await ctx.registry.renew(
                ctx.replica_id, [h.session_id for h in handles], REGISTRY_LEASE_S
            )
            for handle in handles:
                if handle.state == QUEUED and handle.queued_at is not None:
                    await handle.check_queued()
            ctx.state_health.ok()
        except Exception as exc:
            if not is_outage(exc):
                log.exception("sessions.renew_failed")
            else:  # StateHealth logs the outage once; the next renewal tries again
                ctx.state_health.failed(exc)

    async def on_queue_changed(self, _: QueueChanged) -> None:
        """The queue moved: the queued sessions held here tell their browsers."""
        order = {sid: i + 1 for i, sid in enumerate(await self.ctx.registry.queue())}
        self.ctx.metrics.queue_length.set(len(order))
        for handle in list(self._held.values()):
            await handle.on_queue_changed(order)

    def hold(self, handle: SessionHandle) -> None:
        self._held[handle.session_id] = handle

    def let_go(self, handle: SessionHandle) -> bool:
        """Forget the handle; False if another one (or none) holds its session here."""
        if self._held.get(handle.session_id) is not handle:
            return False
        del self._held[handle.session_id]
        return True
