"""Share links: a viewer's token bound to one session, minted for the session's controller.

The token is a JWT of role `viewer` with the session's id (`sid`) and an expiry: it opens `/ws`
as a viewer's token (where auth is on, `auth.Authenticator` checks it like any other) and lets
its holder watch that session only (`session.watch`). It is signed with the replica's first key,
so that every replica reads it; with no key (`--auth off`), with a key made at start, good on
this replica only. The link carries it in the URL's fragment, which browsers never send.
"""

from __future__ import annotations

import io
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import jwt
import segno

from render_server.protocol.errors import ProtocolError
from render_server.protocol.signaling import MAX_SHARE_TOKEN_CHARS
from render_server.protocol.wire import SESSION_ID, display_name
from render_server.signaling.auth import AUDIENCE, LEEWAY_S, AuthError

DEFAULT_TTL_S: Final = 3600
REWATCH_TTL_S: Final = 900  # a watching viewer's own token, renewed by each watch
SESSION_CLAIM: Final = "sid"
EPOCH_CLAIM: Final = "ep"  # the session's share epoch: stopping sharing bumps it
_OWN_KID: Final = "share"  # the key made at start where no key is configured


@dataclass(frozen=True)
class LinkClaims:
    session_id: str
    epoch: int


@dataclass(frozen=True)
class ShareLink:
    token: str
    expires_at: int
    url: str | None = None
    qr_svg: str | None = None


class ShareLinks:
    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = dict(keys) or {_OWN_KID: secrets.token_bytes(32)}
        self._kid = next(iter(self._keys))

    def mint(
        self,
        session_id: str,
        ttl_s: int = DEFAULT_TTL_S,
        page_url: str | None = None,
        epoch: int = 0,
    ) -> ShareLink:
        """A link to watch `session_id` for `ttl_s` seconds while its share epoch is `epoch`;
        with its URL and QR code where the page gave its own address."""  # fmt: skip
        now = int(time.time())
        claims = {
            "sub": f"viewer-{uuid.uuid4().hex[:12]}",
            "role": "viewer",
            "aud": AUDIENCE,
            SESSION_CLAIM: session_id,
            EPOCH_CLAIM: epoch,
            "iat": now,
            "exp": now + ttl_s,
            "jti": secrets.token_hex(8),
        }
        key = self._keys[self._kid]
        token = jwt.encode(claims, key, algorithm="HS256", headers={"kid": self._kid})
        if page_url is None:
            return ShareLink(token, now + ttl_s)
        url = f"{page_url}#watch={token}"
        return ShareLink(token, now + ttl_s, url, qr_svg(url))

    def read(self, token: str) -> LinkClaims:
        """The session (and share epoch) a valid share token lets its holder watch; AuthError
        otherwise."""
        if len(token) > MAX_SHARE_TOKEN_CHARS:
            raise AuthError("unauthorized", "the share link's token is too long")
        try:
            kid = str(jwt.get_unverified_header(token).get("kid", "default"))
            key = self._keys.get(kid)
            if key is None:
                raise AuthError(
                    "unauthorized", "the share link was made by another server (or its key "
                    "was rotated away): ask for a new link",
                )  # fmt: skip
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["HS256"], audience=AUDIENCE, leeway=LEEWAY_S,
                options={"require": ["exp", "sub", "role", SESSION_CLAIM]},
            )  # fmt: skip
        except jwt.ExpiredSignatureError:
            raise AuthError(
                "unauthorized", "the share link has expired: ask for a new one"
            ) from None
        except jwt.InvalidTokenError as exc:
            raise AuthError("unauthorized", f"the share link is not valid: {exc}") from None
        session_id, epoch = claims.get(SESSION_CLAIM), claims.get(EPOCH_CLAIM, 0)
        if (
            claims.get("role") != "viewer"
            or not (isinstance(session_id, str) and SESSION_ID.fullmatch(session_id))
            or type(epoch) is not int
        ):
            raise AuthError("unauthorized", "that token is not a share link's")
        return LinkClaims(session_id, epoch)


def owner_name(subject: str) -> str | None:
    """The owner's name as the session's viewers see it: its token's subject, where that is a
    name (not an anonymous caller's, not an id-like string too long to show)."""
    try:
        name = display_name(subject)
    except ProtocolError:
        return None
    return None if name == "anonymous" else name


def qr_svg(text: str) -> str:
    """`text` as a QR code, an SVG document (black modules on white, a 4-module quiet zone)."""
    qr = segno.make(text, error="m")
    out = io.BytesIO()
    qr.save(out, kind="svg", scale=4, border=4, xmldecl=False, svgclass="share-qr",
            lineclass=None, light="#fff")  # fmt: skip
    return out.getvalue().decode()
