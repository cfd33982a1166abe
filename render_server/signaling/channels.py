"""The bus as the signaling side uses it: which channel each message travels on, typed.

Messages are `protocol/bus.py`'s types: serialized when published, parsed when delivered. A
malformed message (a peer's bug, another version) is logged and dropped before any handler
sees it; handlers take typed messages only.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from render_server.protocol.bus import (
    QueueChanged,
    SessionNews,
    parse_queue_news,
    parse_session_news,
    parse_viewer_news,
    parse_worker_request,
    to_bus,
)
from render_server.protocol.errors import ProtocolError
from render_server.protocol.viewers import ViewerReply
from render_server.protocol.worker import WorkerRequest
from render_server.signaling.state.bus import Bus, Message

log = logging.getLogger(__name__)

M = TypeVar("M")
Handler = Callable[[M], Awaitable[None]]

QUEUE_CHANNEL = "queue"


def browser_channel(session_id: str) -> str:
    """The channel of a session: it reaches the replica holding the session's browser."""
    return f"browser:{session_id}"


def viewer_channel(viewer_id: str) -> str:
    """The channel of a viewer of a shared session: it reaches the replica holding its socket."""
    return f"viewer:{viewer_id}"


def worker_channel(worker_id: str) -> str:
    """The channel of a worker: it reaches the replica holding the worker's socket."""
    return f"worker:{worker_id}"


class Channels:
    """A replica's bus, typed: publish to a session, a worker or the queue; subscribe to them."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    # -- publishing ---------------------------------------------------------------------------

    async def to_session(self, session_id: str, news: SessionNews) -> None:
        await self.bus.publish(browser_channel(session_id), to_bus(news))

    async def to_viewer(self, viewer_id: str, news: ViewerReply) -> None:
        await self.bus.publish(viewer_channel(viewer_id), to_bus(news))

    async def to_worker(self, worker_id: str, request: WorkerRequest) -> None:
        await self.bus.publish(worker_channel(worker_id), to_bus(request))

    async def queue_changed(self) -> None:
        await self.bus.publish(QUEUE_CHANNEL, to_bus(QueueChanged()))

    # -- subscribing --------------------------------------------------------------------------

    async def on_session(self, session_id: str, handler: Handler[SessionNews]) -> None:
        await self._subscribe(browser_channel(session_id), parse_session_news, handler)

    async def on_viewer(self, viewer_id: str, handler: Handler[ViewerReply]) -> None:
        await self._subscribe(viewer_channel(viewer_id), parse_viewer_news, handler)

    async def on_worker(self, worker_id: str, handler: Handler[WorkerRequest]) -> None:
        await self._subscribe(worker_channel(worker_id), parse_worker_request, handler)

    async def on_queue(self, handler: Handler[QueueChanged]) -> None:
        await self._subscribe(QUEUE_CHANNEL, parse_queue_news, handler)

    async def leave_session(self, session_id: str) -> None:
        await self.bus.unsubscribe(browser_channel(session_id))

    async def leave_viewer(self, viewer_id: str) -> None:
        await self.bus.unsubscribe(viewer_channel(viewer_id))

    async def leave_worker(self, worker_id: str) -> None:
        await self.bus.unsubscribe(worker_channel(worker_id))

    async def close(self) -> None:
        await self.bus.close()

    async def _subscribe(
        self, channel: str, parse: Callable[[Any], M], handler: Handler[M]
    ) -> None:
        async def deliver(doc: Message) -> None:
            try:
                message = parse(doc)
            except ProtocolError as exc:
                log.warning(
                    "bus.bad_message",
                    extra={"channel": channel, "code": exc.code, "detail": exc.message[:200]},
                )
                return
            await handler(message)

        await self.bus.subscribe(channel, deliver)
