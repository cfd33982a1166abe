"""`loadScene`: a session switches to an uploaded scene without its stream stopping.

The command is answered at once (`{"scene": id, "status": "loading"}`); the file is fetched,
checked, parsed and its renderer tables built off the frame path while the old scene keeps
streaming; then the frame thread swaps to it at its next frame, the camera framed on it, and the
page gets a `scene` message: `loaded` (with triangles and objects) or `failed` (with a code and a
message for the designer). Only the newest request counts: an older one that finishes later is
dropped. docs/data-channel.md describes the messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from render_server.metrics import Metrics
from render_server.protocol.data_channel import CommandError
from render_server.protocol.scenes import TicketError, upload_reference_problem
from render_server.render.cpu.prepare import prepare_scene
from render_server.render.scene import Scene
from render_server.scene_formats.errors import SceneError
from render_server.stream.scene_fetch import SceneFetcher, SceneUnavailable

log = logging.getLogger(__name__)


class SceneLoading:
    """One session's uploaded-scene loads. `swap` hands a loaded scene to the session's
    commands (`SceneCommands.replace_base`); `send` writes a data-channel message."""

    def __init__(
        self,
        fetcher: SceneFetcher,
        swap: Callable[[Scene], None],
        send: Callable[[dict[str, Any]], None],
        metrics: Metrics,
        prepare: bool = True,
    ) -> None:
        self._fetcher = fetcher
        self._swap = swap
        self._send = send
        self._metrics = metrics
        self._prepare = prepare  # build the CPU renderer's tables ahead (a CPU worker)
        self._task: asyncio.Task[None] | None = None
        self.upload: dict[str, str] | None = None  # the scene shown now: {"scene", "ticket"}

    def start(self, args: dict[str, Any]) -> dict[str, Any]:
        """`loadScene`'s immediate value; CommandError for arguments that are not an upload."""
        unknown = sorted(set(args) - {"scene", "ticket"})
        if unknown:
            raise CommandError("bad_command", f"unknown argument {unknown[0][:64]!r}")
        scene_id, ticket = args.get("scene"), args.get("ticket")
        problem = upload_reference_problem(scene_id, ticket)
        if problem is not None:
            raise CommandError("bad_command", problem)
        self.cancel()
        self._task = asyncio.get_running_loop().create_task(self._load(str(scene_id), str(ticket)))
        return {"scene": scene_id, "status": "loading"}

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def _load(self, scene_id: str, ticket: str) -> None:
        try:
            scene = await self._fetcher.fetch(scene_id, ticket)
            if self._prepare:
                await asyncio.get_running_loop().run_in_executor(None, prepare_scene, scene)
        except asyncio.CancelledError:
            raise
        except TicketError as exc:
            self._fail(scene_id, "refused", exc.code, exc.message)
        except SceneError as exc:
            self._fail(scene_id, "refused", "bad_scene", str(exc))
        except SceneUnavailable as exc:
            self._fail(scene_id, "failed", "unavailable", str(exc))
        except Exception as exc:  # a loader's bug must not end the session: say it and go on
            log.exception("scene.load_failed", extra={"scene": scene_id})
            self._fail(scene_id, "failed", "internal", f"the scene could not be loaded ({exc})")
        else:
            self._swap(scene)
            self.upload = {"scene": scene_id, "ticket": ticket}
            self._metrics.scene_loads.labels("loaded").inc()
            self._send({
                "type": "scene", "scene": scene_id, "status": "loaded",
                "triangles": scene.triangle_count, "objects": len(scene.objects),
            })  # fmt: skip

    def _fail(self, scene_id: str, outcome: str, code: str, message: str) -> None:
        self._metrics.scene_loads.labels(outcome).inc()
        self._send({"type": "scene", "scene": scene_id, "status": "failed", "code": code,
                    "message": message[:500]})  # fmt: skip
