"""Which pages may open a signaling socket: the server's own origin and an allow-list.

A browser always sends `Origin` on a WebSocket upgrade, so another site's script cannot drive
the stream from a user's browser. Programs without an Origin (the Python client, load tests)
pass here; tokens (a later layer) are what stops them. On a loopback bind the Host header must
be a loopback name too, which defeats DNS rebinding (evil.example resolving to 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _hostname(host_header: str) -> str:
    return urlsplit("//" + host_header).hostname or ""


def origin_allowed(
    origin: str | None, host_header: str | None, bind_host: str, allowed: tuple[str, ...]
) -> tuple[bool, str]:
    """(allowed, reason) for an upgrade request with these headers."""
    if host_header is None:
        return False, "no Host header"
    if is_loopback(bind_host) and not is_loopback(_hostname(host_header)):
        return False, f"Host {host_header!r} is not a loopback name on a loopback-only server"
    if origin is None:
        return True, "no Origin: not a browser page"
    if origin.rstrip("/") in allowed:
        return True, "allow-listed origin"
    parts = urlsplit(origin)
    if parts.scheme in ("http", "https") and parts.netloc == host_header:
        return True, "same origin"
    return False, f"Origin {origin!r} is not this server and not in the allow-list"
