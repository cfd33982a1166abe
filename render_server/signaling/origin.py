"""Which pages may reach the server: the server's own origin and an allow-list.

A browser always sends `Origin` on a WebSocket upgrade and on a cross-site POST, PUT, PATCH or
DELETE, so another site's script cannot drive the stream or the REST API from a user's browser.
Programs without an Origin (the Python client, load tests) pass here; tokens are what stops
them. On a loopback bind the Host header of every request must be a loopback name too, which
defeats DNS rebinding (evil.example resolving to 127.0.0.1, so the page is "same origin").
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number raises here
    except ValueError:  # "[" or "host:port:junk": hostile, not a crash
        return None
    return parts


def _hostname(host_header: str) -> str:
    parts = _split("//" + host_header)
    return (parts.hostname or "") if parts is not None else ""


def host_allowed(host_header: str | None, bind_host: str) -> tuple[bool, str]:
    """(allowed, reason) for a request's Host header on a server bound to `bind_host`."""
    if not is_loopback(bind_host):
        return True, "not a loopback-only server"
    if host_header is None:
        return False, "no Host header"
    if not is_loopback(_hostname(host_header)):
        return False, f"Host {host_header!r} is not a loopback name on a loopback-only server"
    return True, "loopback name"


def origin_allowed(
    origin: str | None, host_header: str | None, bind_host: str, allowed: tuple[str, ...]
) -> tuple[bool, str]:
    """(allowed, reason) for an upgrade or a state-changing request with these headers."""
    if host_header is None:
        return False, "no Host header"
    ok, reason = host_allowed(host_header, bind_host)
    if not ok:
        return False, reason
    if origin is None:
        return True, "no Origin: not a browser page"
    if origin.rstrip("/") in allowed:
        return True, "allow-listed origin"
    parts = _split(origin)
    if parts is not None and parts.scheme in ("http", "https") and parts.netloc == host_header:
        return True, "same origin"
    return False, f"Origin {origin!r} is not this server and not in the allow-list"
