"""One viewer of a shared session, as the replica holding its socket sees it.

The viewer names the session by a share link's token (`share_links.py`); its offer, candidates
and leaving go to whichever worker holds the session when it offers (a session that moved is
found on its new worker), and what that worker says to this viewer comes back on the viewer's
own bus channel. Nothing here touches the session's slot, record or owner: a viewer only ever
adds a peer connection on the worker, which the worker bounds (`--max-viewers`).
"""

from __future__ import annotations

import uuid

from render_server.logs import session_logger
from render_server.protocol.errors import ErrorCode, ProtocolError
from render_server.protocol.signaling import (
    Answer,
    IceCandidate,
    WatchEnded,
    Watching,
)
from render_server.protocol.viewers import (
    RETRYABLE_ENDINGS,
    ViewerAnswer,
    ViewerEnded,
    ViewerIce,
    ViewerLeave,
    ViewerOffer,
    ViewerReply,
)
from render_server.signaling.context import SignalingContext
from render_server.signaling.session import Send
from render_server.signaling.turn import ice_servers_for

NOT_STREAMING = "not_streaming"


class ViewerHandle:
    def __init__(self, ctx: SignalingContext, session_id: str, name: str, send: Send) -> None:
        self.ctx = ctx
        self.session_id = session_id
        self.viewer_id = uuid.uuid4().hex
        self.name = name
        self.log = session_logger(__name__, session_id, viewer=self.viewer_id[:12])
        self.worker_id: str | None = None  # the worker its offer went to
        self.live = False  # subscribed, not ended
        self._send = send

    async def start(self, rewatch_token: str) -> None:
        """Subscribe to the viewer's channel and tell the page it may offer (and what to watch
        again with)."""
        await self.ctx.channels.on_viewer(self.viewer_id, self._on_news)
        self.live = True
        self.ctx.metrics.viewers.inc()
        config = self.ctx.config
        servers = ice_servers_for(
            self.viewer_id, config.ice_servers, config.turn_urls, config.turn_secret,
            config.turn_ttl_s,
        )  # fmt: skip
        self.log.info("viewer.watching", extra={"viewer_name": self.name})
        await self._send(Watching(self.session_id, self.viewer_id, servers, rewatch_token))

    async def offer(self, sdp: str) -> None:
        if self.worker_id is not None:
            raise ProtocolError(ErrorCode.BAD_ORDER, "offered already: watch again to re-offer")
        worker = await self.ctx.registry.worker_of(self.session_id)
        if worker is None:  # queued, moving, or its worker just went: the page tries again
            await self._end(NOT_STREAMING, "no worker streams the session right now")
            return
        self.worker_id = worker
        request = ViewerOffer(self.session_id, self.viewer_id, sdp, self.name)
        await self.ctx.channels.to_worker(worker, request)

    async def ice(self, candidate: IceCandidate) -> None:
        if self.worker_id is None:
            raise ProtocolError(ErrorCode.BAD_ORDER, "send the offer before ICE candidates")
        request = ViewerIce.of(self.session_id, self.viewer_id, candidate)
        await self.ctx.channels.to_worker(self.worker_id, request)

    async def leave(self, reason: str = "left") -> None:
        """The page stops watching (or its socket closed): the worker closes its peer."""
        if not self.live:
            return
        await self._let_go()
        if self.worker_id is not None:
            request = ViewerLeave(self.session_id, self.viewer_id, reason)
            await self.ctx.channels.to_worker(self.worker_id, request)

    async def _on_news(self, reply: ViewerReply) -> None:
        if not self.live:
            return
        if isinstance(reply, ViewerAnswer):
            await self._send(Answer(reply.sdp))
        elif isinstance(reply, ViewerEnded):
            await self._end(reply.code, reply.message)

    async def _end(self, code: str, message: str) -> None:
        self.log.info("viewer.ended", extra={"code": code})
        await self._let_go()
        await self._send(WatchEnded(code, message, retry=code in RETRYABLE_ENDINGS))

    async def _let_go(self) -> None:
        if self.live:
            self.live = False
            self.ctx.metrics.viewers.dec()
            await self.ctx.channels.leave_viewer(self.viewer_id)
