"""What one signaling replica shares among its connections: config, registry, bus, store."""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from render_server.config import ServerConfig
from render_server.metrics import Metrics
from render_server.signaling.auth import Authenticator
from render_server.signaling.state.bus import Bus
from render_server.signaling.state.registry import Registry
from render_server.signaling.state.session_store import SessionStore

if TYPE_CHECKING:
    from render_server.signaling.session import SessionHandle

QUEUE_CHANNEL = "queue"

audit_log = logging.getLogger("render_server.audit")


def browser_channel(session_id: str) -> str:
    return f"browser:{session_id}"


def worker_channel(worker_id: str) -> str:
    return f"worker:{worker_id}"


def audit(event: str, **fields: Any) -> None:
    """One line per security-relevant event: session start/end, refusals, rate limits."""
    audit_log.info(event, extra=fields)


@dataclass
class SignalingContext:
    config: ServerConfig
    registry: Registry
    bus: Bus
    store: SessionStore
    metrics: Metrics
    auth: Authenticator
    replica_id: str
    handles: dict[str, SessionHandle] = field(default_factory=dict)
    # the browsers' sockets, closed with 1001 on shutdown so that clients resume elsewhere at once
    browser_sockets: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
