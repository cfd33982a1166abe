"""A worker's way to an uploaded scene: the ticket checked, the file read, checked and loaded.

Two sources, one result. A worker inside `serve` (or with the scene folder mounted) reads the
folder signaling writes, and checks the ticket itself with signaling's key; a remote worker
asks signaling over HTTP (`GET /api/scenes/{id}/file`, its worker token and the ticket), and
signaling checks. Either way the file is checked again here (`check_upload`): what a worker
parses is never trusted to have been checked elsewhere. Everything is bounded: bytes by the
worker's `--max-scene-bytes`, the download by a timeout, the parse by `--max-triangles`.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from render_server.protocol.scenes import KINDS, SCENE_ID, TICKET_HEADER, TicketError, read_ticket
from render_server.render.scene import Scene
from render_server.render.scene_files import SceneLimits, load_scene
from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.upload_file import check_upload, unpack_archive

DOWNLOAD_TIMEOUT_S = 120.0  # a 256 MiB model over a slow link inside a cluster
CHUNK = 256 * 1024


class SceneUnavailable(Exception):
    """The scene could not be fetched (signaling out of reach, an answer that is no file)."""


@dataclass(frozen=True)
class SceneSource:
    """Where uploaded scenes are read: `folder` (with `ticket_key` to check tickets here) or
    signaling's `url` (http(s)://host:port) with this worker's `token`."""

    folder: Path | None = None
    ticket_key: bytes | None = None
    url: str | None = None
    token: str | None = None

    def __post_init__(self) -> None:
        if (self.folder is None) == (self.url is None):
            raise ValueError("a scene source is a folder or a URL, one of them")
        if self.folder is not None and not self.ticket_key:
            raise ValueError("a scene folder needs signaling's ticket key to check tickets")


class SceneFetcher:
    def __init__(self, source: SceneSource, limits: SceneLimits) -> None:
        self.source = source
        self.limits = limits

    async def fetch(self, scene_id: str, ticket: str) -> Scene:
        """The scene; TicketError (the ticket), SceneError (the file) or SceneUnavailable."""
        if not SCENE_ID.fullmatch(scene_id):
            raise SceneError(f"{scene_id[:64]!r} is not a scene id")
        with tempfile.TemporaryDirectory(prefix="render-server-scene-") as work:
            folder = Path(work)
            if self.source.folder is not None:
                path = self._from_folder(self.source.folder, scene_id, ticket)
            else:
                path = await self._download(scene_id, ticket, folder)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, self._load, path, folder, scene_id)

    def _from_folder(self, root: Path, scene_id: str, ticket: str) -> Path:
        assert self.source.ticket_key is not None
        owner = read_ticket(self.source.ticket_key, ticket, scene_id)
        try:
            meta = json.loads((root / scene_id / "meta.json").read_text())
            kind = meta["kind"]
            stored_owner = meta["owner"]
        except (OSError, ValueError, KeyError, TypeError):
            raise SceneError(f"scene {scene_id} is not (or no longer) stored") from None
        if stored_owner != owner or kind not in KINDS:
            # the ticket's signature holds, so this is a stale or crossed id: say nothing more
            raise TicketError("forbidden", f"scene {scene_id} is not this ticket's owner's")
        return root / scene_id / f"model.{kind}"

    async def _download(self, scene_id: str, ticket: str, folder: Path) -> Path:
        assert self.source.url is not None
        headers = {TICKET_HEADER: ticket}
        if self.source.token:
            headers["Authorization"] = f"Bearer {self.source.token}"
        url = f"{self.source.url.rstrip('/')}/api/scenes/{scene_id}/file"
        target = folder / "download"
        timeout = aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT_S, sock_connect=10.0)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(url, headers=headers) as answer,
            ):
                if answer.status != 200:
                    raise _refusal(answer.status, await answer.text())
                size = 0
                with target.open("wb") as out:
                    async for chunk in answer.content.iter_chunked(CHUNK):
                        size += len(chunk)
                        if size > self.limits.max_bytes:
                            raise SceneError(
                                f"scene {scene_id} is over this worker's limit of "
                                f"{self.limits.max_bytes} bytes (--max-scene-bytes)"
                            )
                        out.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise SceneUnavailable(f"signaling did not hand over scene {scene_id}: {exc}") from exc
        return target

    def _load(self, path: Path, folder: Path, scene_id: str) -> Scene:
        """On a thread: check what the file is, unpack an archive, load and prepare it."""
        kind = check_upload(path, self.limits.max_bytes)
        if kind == "zip":
            model = unpack_archive(path, folder / "unpacked", self.limits.max_bytes)
        elif path.suffix == f".{kind}":
            model = path  # the scene folder's file, named by its kind: read where it lies
        elif path.parent == folder:
            model = path.rename(folder / f"model.{kind}")  # a download: the loader goes by suffix
        else:
            raise SceneError(f"scene {scene_id} is stored as another kind than it holds")
        try:
            return load_scene(model, self.limits)
        except SceneError as exc:
            # the temporary folder means nothing to a designer; the scene's name does
            raise SceneError(str(exc).replace(str(model), f"scene {scene_id}")) from None


def _refusal(status: int, body: str) -> Exception:
    """Signaling's error answer as the exception a session reports."""
    try:
        error = json.loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "unavailable", body[:200] or f"HTTP {status}"
    if status in (401, 403):
        return TicketError(code, message)
    if status in (404, 413, 415, 422):
        return SceneError(message)
    return SceneUnavailable(f"signaling answered {status}: {message}")
