"""HTTPS for a replica without a proxy in front (`--tls-cert`, `--tls-key`): the page, the REST
API and the WebSockets (the page and the SDK take wss:// from an https:// page on their own)."""

from __future__ import annotations

import ssl
from pathlib import Path

from render_server.config import ConfigError

HANDSHAKE_TIMEOUT_S = 10.0  # a client that opens a connection and never finishes its handshake


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for TLS 1.2 and later with Python's default ciphers; ConfigError, naming
    the files, where they cannot be read or do not match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot use --tls-cert {cert} with --tls-key {key}: {reason}") from None
    return context
