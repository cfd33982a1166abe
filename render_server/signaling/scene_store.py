"""Uploaded scenes on signaling's disk: `<root>/<scene id>/model.<kind>` and its `meta.json`.

An upload streams into a temporary file in the root (`.upload-*.part`), counted as it arrives
and refused the moment it passes the limit; the whole file is then checked (`check_upload`) and
renamed into a folder of its own, its `meta.json` written last (through a rename too): a scene
whose meta.json exists is complete. Workers of `serve`, and any worker that mounts the folder,
read it there (stream/scene_fetch.py); replicas that share the folder share the scenes.

Every owner has a quota of bytes and of scenes, and at most `max_in_flight` uploads arriving at
once (per replica). Scenes older than the retention time are swept, and so is what a crash left
behind. File work runs on threads, each wait bounded: a disk that stalls answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from render_server.config import ConfigError
from render_server.protocol.scenes import KINDS, SCENE_ID
from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.upload_file import NotAModel, check_upload

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

PART_PREFIX = ".upload-"
TRASH_PREFIX = ".trash-"
META = "meta.json"
MAX_META_BYTES = 64 * 1024
FLUSH_BYTES = 1024 * 1024  # chunks gathered before a write on a thread
FILE_TIMEOUT_S = 30.0  # one bounded piece of file work (a write, a listing, a rename)
CHECK_TIMEOUT_S = 120.0  # check_upload of the largest file (a glTF's JSON parsed whole)
SWEEP_TIMEOUT_S = 300.0
LEFTOVER_AGE_S = 3600.0  # a part file or a folder without meta.json this old was abandoned


@dataclass(frozen=True)
class StoreLimits:
    max_file_bytes: int
    quota_bytes: int  # all of one owner's stored scenes together
    max_scenes: int  # scenes one owner may keep
    retention_s: float
    max_in_flight: int = 2  # one owner's uploads arriving at once

    @property
    def sweep_every_s(self) -> float:
        return min(600.0, max(0.25, self.retention_s / 4))


@dataclass(frozen=True)
class StoredScene:
    scene_id: str
    owner: str
    name: str
    kind: str
    size: int
    created: float

    def meta(self) -> dict[str, Any]:
        return {"owner": self.owner, "name": self.name, "kind": self.kind,
                "bytes": self.size, "created": self.created}  # fmt: skip


class StoreError(Exception):
    """A refused or failed store operation, as its HTTP answer: status, code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


async def off_loop(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn` on a thread, waited for FILE_TIMEOUT_S at most (the thread is not stopped: a stuck
    disk call cannot be, but the request answers)."""
    return await _bounded(FILE_TIMEOUT_S, fn, *args, **kwargs)


async def _bounded(timeout: float, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.to_thread(fn, *args, **kwargs)
    except TimeoutError:
        raise StoreError(
            503, "unavailable", "the scene folder did not answer in time: try again shortly"
        ) from None


def clean_name(name: str | None, kind: str) -> str:
    """A file name to show: no folders, no control characters, at most 200 characters."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if ch.isprintable()).strip()[:200]
    return base or f"model.{kind}"


class SceneStore:
    def __init__(self, root: Path, limits: StoreLimits) -> None:
        self.root = root
        self.limits = limits
        self._in_flight: Counter[str] = Counter()
        self._commit = asyncio.Lock()  # quota checked and the scene renamed in, one at a time

    @classmethod
    def open(cls, root: Path, limits: StoreLimits) -> SceneStore:
        """The store at `root`, made if missing; ConfigError when it is no writable folder."""
        root = root.expanduser()
        try:
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = root / f"{PART_PREFIX}probe-{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"--scene-dir {root} is not a writable folder: {exc.strerror or exc}"
            ) from None
        return cls(root.resolve(), limits)

    def file_of(self, scene: StoredScene) -> Path:
        return self.root / scene.scene_id / f"model.{scene.kind}"

    def in_flight(self, owner: str) -> int:
        return self._in_flight[owner]

    @contextlib.contextmanager
    def uploading(self, owner: str) -> Iterator[None]:
        """One of `owner`'s uploads arriving; StoreError 429 beyond `max_in_flight`."""
        if self._in_flight[owner] >= self.limits.max_in_flight:
            raise StoreError(
                429, "too_many_uploads",
                f"{self._in_flight[owner]} of your uploads are still arriving: wait for one "
                "to finish",
            )  # fmt: skip
        self._in_flight[owner] += 1
        try:
            yield
        finally:
            self._in_flight[owner] -= 1
            if self._in_flight[owner] <= 0:
                del self._in_flight[owner]

    async def check_room(self, owner: str, size: int) -> None:
        """StoreError 429 when `owner` cannot store `size` more bytes (or one more scene)."""
        scenes = await off_loop(self._scan, owner)
        self._room(scenes, size)

    async def receive(
        self, owner: str, name: str | None, chunks: AsyncIterator[bytes]
    ) -> StoredScene:
        """Store the file `chunks` bring for `owner`: StoreError 413 past the size limit,
        415/422 for what is no model (or a broken or unsafe one), 429 over the quota."""
        part = self.root / f"{PART_PREFIX}{secrets.token_hex(8)}.part"
        try:
            size = await self._write(part, chunks)
            try:
                kind = await _bounded(
                    CHECK_TIMEOUT_S, check_upload, part, self.limits.max_file_bytes
                )
            except NotAModel as exc:
                raise StoreError(415, "not_a_model", _named(name, exc)) from None
            except SceneError as exc:
                raise StoreError(422, "bad_model", _named(name, exc)) from None
            shown = clean_name(name, kind)
            async with asyncio.timeout(FILE_TIMEOUT_S * 2):  # the lock: one commit's time
                async with self._commit:
                    return await off_loop(self._commit_file, part, owner, shown, kind, size)
        except TimeoutError:
            raise StoreError(503, "unavailable", "the scene folder is busy: try again") from None
        finally:
            # a single unlink, here even when cancelled: nothing half-written stays on disk
            with contextlib.suppress(OSError):
                part.unlink(missing_ok=True)

    async def _write(self, part: Path, chunks: AsyncIterator[bytes]) -> int:
        limit = self.limits.max_file_bytes
        size = 0
        out = await off_loop(part.open, "xb")
        try:
            pending = bytearray()
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise StoreError(
                        413, "too_large",
                        f"the file is over the upload limit of {limit} bytes (--max-scene-bytes)",
                    )  # fmt: skip
                pending += chunk
                if len(pending) >= FLUSH_BYTES:
                    full, pending = pending, bytearray()
                    await off_loop(out.write, full)
            if pending:
                await off_loop(out.write, pending)
        finally:
            out.close()
        return size

    def _commit_file(self, part: Path, owner: str, name: str, kind: str, size: int) -> StoredScene:
        self._room(self._scan(owner), size)
        scene = StoredScene(secrets.token_hex(16), owner, name, kind, size, time.time())
        folder = self.root / scene.scene_id
        folder.mkdir(mode=0o700)
        os.replace(part, self.file_of(scene))
        meta = folder / f"{META}.part"
        meta.write_text(json.dumps(scene.meta()), encoding="utf-8")
        os.replace(meta, folder / META)  # last: from now on the scene exists
        return scene

    def _room(self, scenes: list[StoredScene], size: int) -> None:
        limits = self.limits
        if len(scenes) >= limits.max_scenes:
            raise StoreError(
                429, "too_many_scenes",
                f"you keep {len(scenes)} scenes, the most one owner may: delete one first "
                "(DELETE /api/scenes/{id})",
            )  # fmt: skip
        used = sum(s.size for s in scenes)
        if used + size > limits.quota_bytes:
            raise StoreError(
                429, "over_quota",
                f"this upload ({size} bytes) would take your stored scenes to {used + size} "
                f"bytes, over your quota of {limits.quota_bytes} bytes: delete some first",
            )  # fmt: skip

    # -- reading, deleting, sweeping -------------------------------------------------------

    async def get(self, scene_id: str) -> StoredScene | None:
        if not SCENE_ID.fullmatch(scene_id):
            return None
        return await off_loop(self._read, scene_id)

    async def owned(self, owner: str | None) -> list[StoredScene]:
        """`owner`'s scenes (None: everyone's), newest first."""
        return await off_loop(self._scan, owner)

    async def delete(self, scene_id: str) -> None:
        await off_loop(self._remove, scene_id)

    async def sweep(self, now: float | None = None) -> int:
        """Remove the scenes older than the retention time, and what failed uploads left."""
        return await _bounded(SWEEP_TIMEOUT_S, self._sweep, time.time() if now is None else now)

    def _read(self, scene_id: str) -> StoredScene | None:
        meta = self.root / scene_id / META
        try:
            if meta.stat().st_size > MAX_META_BYTES:
                return None
            doc = json.loads(meta.read_text(encoding="utf-8"))
            scene = StoredScene(
                scene_id, str(doc["owner"]), str(doc["name"]), str(doc["kind"]),
                int(doc["bytes"]), float(doc["created"]),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing (deleted, or not yet complete) or not ours
        return scene if scene.kind in KINDS else None

    def _scan(self, owner: str | None) -> list[StoredScene]:
        scenes = []
        for entry in os.scandir(self.root):
            if SCENE_ID.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False):
                scene = self._read(entry.name)
                if scene is not None and (owner is None or scene.owner == owner):
                    scenes.append(scene)
        return sorted(scenes, key=lambda s: s.created, reverse=True)

    def _remove(self, scene_id: str) -> None:
        """Out of sight at once (a rename), then removed."""
        trash = self.root / f"{TRASH_PREFIX}{scene_id}-{secrets.token_hex(4)}"
        try:
            os.replace(self.root / scene_id, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def _sweep(self, now: float) -> int:
        cutoff = now - self.limits.retention_s
        removed = 0
        for entry in os.scandir(self.root):
            try:
                age = now - entry.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue
            if SCENE_ID.fullmatch(entry.name):
                scene = self._read(entry.name)
                expired = scene.created < cutoff if scene else age > LEFTOVER_AGE_S
                if expired:
                    self._remove(entry.name)
                    removed += scene is not None
            elif entry.name.startswith((PART_PREFIX, TRASH_PREFIX)) and age > LEFTOVER_AGE_S:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
        return removed


def _named(name: str | None, exc: SceneError) -> str:
    """The check's message, with the designer's file name in front where there is one."""
    shown = clean_name(name, "")
    return f"{shown}: {exc}" if name and shown else str(exc)
