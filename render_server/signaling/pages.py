"""The pages a replica serves: the designer page, the iframe embed and the client's files, with
the headers that keep them from being framed or sniffed where they should not be."""

from __future__ import annotations

import html
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from render_server.signaling.edge import ctx_of

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' blob:; connect-src 'self' ws: wss:; frame-ancestors 'self'"
)
EMBED_ORIGINS_PLACEHOLDER = "{{allowed_origins}}"


@web.middleware
async def security_headers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # a refusal is a response too: same headers
        _add_headers(request, exc)
        raise
    _add_headers(request, response)
    return response


def _add_headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith("/client/") and response.status < 400:
        # the SDK is public code: any site may load it as a module (which is a CORS fetch);
        # who may then open a stream is the signaling socket's business (Origin, token)
        response.headers.setdefault("Access-Control-Allow-Origin", "*")
        response.headers.setdefault("Cross-Origin-Resource-Policy", "cross-origin")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "no-referrer")


async def index(request: web.Request) -> web.StreamResponse:
    client_dir: Path = ctx_of(request).config.client_dir
    headers = {"Cache-Control": "no-cache", "Content-Security-Policy": CSP}
    return web.FileResponse(client_dir / "index.html", headers=headers)


async def examples(request: web.Request) -> web.StreamResponse:
    """The examples' index at /client/examples/ (the static route lists no directory: 403);
    without the slash, a redirect, so that the page's relative links resolve."""
    if not request.path.endswith("/"):
        raise web.HTTPMovedPermanently("/client/examples/")
    client_dir: Path = ctx_of(request).config.client_dir
    return web.FileResponse(client_dir / "examples" / "index.html")


async def embed(request: web.Request) -> web.StreamResponse:
    """The iframe embed: framable by the server's own pages and the allowed origins only."""
    config = ctx_of(request).config
    origins = " ".join(config.allowed_origins)
    template = (config.client_dir / "embed.html").read_text(encoding="utf-8")
    # origins are validated URLs (config), but escape anyway: this lands in an attribute
    page = template.replace(EMBED_ORIGINS_PLACEHOLDER, html.escape(origins, quote=True))
    csp = CSP.replace("frame-ancestors 'self'", f"frame-ancestors 'self' {origins}".strip())
    return web.Response(
        text=page, content_type="text/html",
        headers={"Cache-Control": "no-cache", "Content-Security-Policy": csp},
    )  # fmt: skip
