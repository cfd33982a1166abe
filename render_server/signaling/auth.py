"""Who is connecting: JWT (HS256) tokens with one of four roles, checked at the upgrade.

- `worker`: registers a worker and carries its sessions' media negotiation;
- `controller`: a browser that watches and steers (input reaches the worker);
- `viewer`: a browser that watches only (the worker refuses its input);
- `admin`: an operator's program: reads and ends anyone's session, lists workers over REST,
  but opens neither socket (it neither watches nor serves).

A session's role is the role of the token last presented for it: a resume with a viewer token
makes the session a viewer's, whatever it was.

Browsers cannot set headers on a WebSocket, so a token travels either in `Authorization:
Bearer ...` (programs) or as a WebSocket subprotocol `bearer.<token>` next to `render-server.v1`
(browsers): never in the URL, which proxies and access logs keep.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jwt

from render_server.protocol.errors import CodedError

Role = Literal["worker", "controller", "viewer", "admin"]
ROLES: tuple[Role, ...] = ("worker", "controller", "viewer", "admin")
BROWSER_ROLES: tuple[Role, ...] = ("controller", "viewer")  # who may open /ws
SESSION_ROLES: tuple[Role, ...] = (*BROWSER_ROLES, "admin")  # who may read or end sessions
AUDIENCE = "render-server"
BEARER_PREFIX = "bearer."
MAX_TOKEN_CHARS = 4096
LEEWAY_S = 5.0  # clock skew tolerated on exp/nbf


class AuthError(CodedError):
    """A refused credential: code `unauthorized` (none or bad) or `forbidden` (wrong role)."""


@dataclass(frozen=True)
class Identity:
    subject: str
    role: Role
    anonymous: bool = False
    session: str | None = None  # a share link's token: it may only watch this session


def load_keys(secret: str | None, key_file: Path | None) -> dict[str, bytes]:
    """The signing keys by key id: one `--secret` (id "default") and/or a key set file.

    A key set is JSON `{"keys": {"2026-11": "secret...", ...}}`; tokens name their key in the
    `kid` header, so keys can be rotated without cutting anyone off.
    """
    keys: dict[str, bytes] = {}
    if secret:
        keys["default"] = secret.encode()
    if key_file is not None:
        try:
            doc = json.loads(key_file.read_text())
            for kid, value in dict(doc["keys"]).items():
                keys[str(kid)] = str(value).encode()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"key set {key_file} is not {{'keys': {{kid: secret}}}}: {exc}"
            ) from exc
    for kid, key in keys.items():
        if len(key) < 32:
            raise ValueError(f"key {kid!r} is shorter than 32 bytes: too easy to guess")
    return keys


class Authenticator:
    """Verifies (and mints) tokens; with `required=False` everyone is an anonymous controller."""

    def __init__(self, keys: Mapping[str, bytes], required: bool = True) -> None:
        if required and not keys:
            raise ValueError(
                "authentication is on but there is no key: set --secret (or "
                "RENDER_SERVER_SECRET) or --key-file, or turn it off with --auth off"
            )
        self.keys = dict(keys)
        self.required = required

    def mint(
        self, role: Role, subject: str | None = None, ttl_s: float = 3600.0, kid: str | None = None
    ) -> str:
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        kid = kid or next(iter(self.keys))
        now = int(time.time())
        claims = {
            "sub": subject or f"{role}-{uuid.uuid4().hex[:12]}",
            "role": role,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + int(ttl_s),
            "jti": secrets.token_hex(8),
        }
        return jwt.encode(claims, self.keys[kid], algorithm="HS256", headers={"kid": kid})

    def verify(self, token: str | None, allowed: tuple[Role, ...]) -> Identity:
        if not self.required:
            role = "worker" if allowed == ("worker",) else "controller"
            return Identity("anonymous", role, anonymous=True)  # type: ignore[arg-type]
        if not token:
            raise AuthError("unauthorized", "a token is required (Authorization: Bearer, or "
                            "the WebSocket subprotocol bearer.<token>)")  # fmt: skip
        if len(token) > MAX_TOKEN_CHARS:
            raise AuthError("unauthorized", "the token is too long")
        try:
            kid = jwt.get_unverified_header(token).get("kid", "default")
            key = self.keys.get(str(kid))
            if key is None:
                raise AuthError("unauthorized", f"the token's key {kid!r} is not known here")
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["HS256"], audience=AUDIENCE, leeway=LEEWAY_S,
                options={"require": ["exp", "sub", "role"]},
            )  # fmt: skip
        except jwt.ExpiredSignatureError:
            raise AuthError("unauthorized", "the token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise AuthError("unauthorized", f"the token is not valid: {exc}") from None
        claimed = claims.get("role")
        token_role = next((r for r in ROLES if r == claimed), None)
        if token_role is None:
            raise AuthError("unauthorized", f"the token's role {claimed!r} is unknown")
        if token_role not in allowed:
            raise AuthError("forbidden", f"a {token_role} token cannot open this endpoint")
        bound = claims.get("sid")
        return Identity(str(claims["sub"]), token_role, session=str(bound) if bound else None)


def token_from_headers(headers: Mapping[str, str]) -> str | None:
    """The bearer token: from Authorization, else from Sec-WebSocket-Protocol."""
    authorization = headers.get("Authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip() or None
    offered = [p.strip() for p in headers.get("Sec-WebSocket-Protocol", "").split(",")]
    for protocol in offered:
        if protocol.startswith(BEARER_PREFIX):
            return protocol[len(BEARER_PREFIX) :] or None
    return None
