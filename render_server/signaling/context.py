"""What one signaling replica shares among its connections: config, registry, bus, store."""

from __future__ import annotations

import os
import socket
import uuid
import weakref
from dataclasses import dataclass, field

from aiohttp import web

from render_server.config import ServerConfig
from render_server.metrics import Metrics
from render_server.signaling.auth import Authenticator, load_keys
from render_server.signaling.channels import Channels
from render_server.signaling.share_links import ShareLinks
from render_server.signaling.state.bus import connect_bus
from render_server.signaling.state.outage import StateHealth
from render_server.signaling.state.redis_registry import connect_registry
from render_server.signaling.state.registry import Registry
from render_server.signaling.state.session_store import SessionStore, connect_session_store


@dataclass
class SignalingContext:
    config: ServerConfig
    registry: Registry
    channels: Channels
    store: SessionStore
    metrics: Metrics
    auth: Authenticator
    replica_id: str
    # the browsers' sockets, closed with 1001 on shutdown so that clients resume elsewhere at once
    browser_sockets: weakref.WeakSet[web.WebSocketResponse] = field(default_factory=weakref.WeakSet)
    # whether the shared state (Redis) answers, as this replica's loops and probes found it
    state_health: StateHealth = field(default_factory=StateHealth)
    stopping: bool = False  # shutting down: no longer ready (/readyz answers 503)
    # viewer links to sessions (signed with the first key; a key made now where there is none)
    share_links: ShareLinks = field(default_factory=lambda: ShareLinks({}))

    async def close(self) -> None:
        await self.channels.close()
        await self.registry.close()
        await self.store.close()


async def connect_context(config: ServerConfig, metrics: Metrics) -> SignalingContext:
    """A replica's context: its registry, bus and session store (in memory, or on the
    configured Redis, which must answer), its authenticator and its id."""
    auth = Authenticator(load_keys(config.secret, config.key_file), config.auth_required)
    registry = await connect_registry(config.registry_url)
    bus = await connect_bus(config.registry_url)
    store = await connect_session_store(config.registry_url)
    replica = config.replica_id or default_replica_id()
    return SignalingContext(
        config, registry, Channels(bus), store, metrics, auth, replica,
        share_links=ShareLinks(auth.keys),
    )  # fmt: skip


def default_replica_id() -> str:
    return f"replica-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
