"""Short-lived TURN credentials, minted per session from a secret shared with coturn.

coturn's `use-auth-secret` (the TURN REST API draft): username = "<expiry>:<name>",
password = base64(HMAC-SHA1(secret, username)). coturn recomputes the password and refuses
it after the expiry, so a leaked credential dies with the session's lease.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from render_server.protocol.signaling import IceServer


def turn_credentials(
    urls: tuple[str, ...], secret: str, name: str, ttl_s: float, now: float | None = None
) -> IceServer:
    expiry = int((time.time() if now is None else now) + ttl_s)
    username = f"{expiry}:{name}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return IceServer(
        urls=list(urls), username=username, credential=base64.b64encode(digest).decode()
    )


def ice_servers_for(
    session_id: str,
    stun: tuple[str, ...],
    turn_urls: tuple[str, ...],
    turn_secret: str | None,
    turn_ttl_s: float,
) -> list[IceServer]:
    """The ICE servers both ends of one session get: STUN as is, TURN with fresh credentials."""
    servers = [IceServer(urls=[url]) for url in stun]
    if turn_urls and turn_secret:
        servers.append(turn_credentials(turn_urls, turn_secret, session_id, turn_ttl_s))
    return servers
