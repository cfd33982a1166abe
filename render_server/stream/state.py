"""What travels with a session when it moves to another worker (a drain, a spot VM's notice):
the camera, the quality the page asked for and the scene edits made through commands.

`export_state` writes it as a JSON object of at most MAX_STATE_BYTES; `read_state` reads one
that came over the wire from another process and checks every part: a malformed part is left
out with a WARNING, and the rest is used. It never raises.

    {"v": 1,
     "camera": {"yaw": .., "pitch": .., "distance": .., "target": [x, y, z]},
     "quality": {"width": .., "height": .., "fps": .., "maxKbps": ..},
     "edits": {"materials": [{"name": .., "baseColor": [r, g, b], "roughness": ..,
                              "metallic": ..}],
               "hidden": [object names], "timeOfDay": hours}}
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from render_server.protocol.data_channel import QualityRequest
from render_server.protocol.scenes import upload_reference_problem
from render_server.protocol.worker import MAX_STATE_BYTES
from render_server.render.camera import OrbitCamera
from render_server.render.scene import Material, Scene
from render_server.render.sun import HOURS_PER_DAY
from render_server.stream.quality import QualityLimits, StreamQuality
from render_server.stream.scene_commands import MAX_ANGLE, MAX_TARGET, SceneEdits, place_camera

log = logging.getLogger(__name__)

STATE_VERSION: Final = 1
MAX_SIDE: Final = 16384
MAX_KBPS: Final = 10_000_000


class BadState(ValueError):
    """One part of a session's state that cannot be used."""


@dataclass(frozen=True)
class CameraPose:
    yaw: float
    pitch: float
    distance: float
    target: tuple[float, float, float]

    def apply(self, camera: OrbitCamera) -> None:
        """Put `camera` here, within its own limits (as `setCamera` does)."""
        place_camera(camera, self.yaw, self.pitch, self.distance, self.target)


@dataclass(frozen=True)
class SessionState:
    """A session's state as read: None (or no edits) where it did not say, or said nonsense."""

    camera: CameraPose | None = None
    quality: QualityRequest | None = None
    edits: SceneEdits = field(default_factory=SceneEdits)
    upload: dict[str, str] | None = None  # the uploaded scene shown: {"scene", "ticket"}


def export_state(
    camera: OrbitCamera,
    quality: StreamQuality,
    edits: SceneEdits,
    base: Scene,
    upload: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The session's state as JSON; if the edits would make it larger than MAX_STATE_BYTES,
    hidden objects and then material edits are left out (with a WARNING)."""
    doc: dict[str, Any] = {
        "v": STATE_VERSION,
        "camera": {
            "yaw": camera.yaw,
            "pitch": camera.pitch,
            "distance": camera.distance,
            "target": [float(v) for v in camera.target],
        },
        "quality": {
            "width": quality.resolution.width,
            "height": quality.resolution.height,
            "fps": quality.fps,
            "maxKbps": quality.max_kbps,
        },
        "edits": _edits_doc(edits, base),
    }
    if upload is not None:
        doc["upload"] = dict(upload)  # the next worker loads it again (its edits are lost)
    for part in ("hidden", "materials"):
        if len(json.dumps(doc)) <= MAX_STATE_BYTES:
            break
        log.warning("session.state_too_large", extra={"left_out": part})
        doc["edits"].pop(part, None)
    return doc


def _edits_doc(edits: SceneEdits, base: Scene) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if edits.materials:
        doc["materials"] = [
            {
                "name": material.name,
                "baseColor": [float(c) for c in material.base_color],
                "roughness": material.roughness,
                "metallic": material.metallic,
            }
            for _, material in sorted(edits.materials.items())
        ]
    if edits.hidden:
        doc["hidden"] = [base.objects[i] for i in sorted(edits.hidden)]
    if edits.hours is not None:
        doc["timeOfDay"] = edits.hours
    return doc


def read_state(doc: Mapping[str, Any] | None, base: Scene) -> SessionState:
    """The usable parts of `doc` (another worker's `export_state`, from the wire)."""
    if not doc:
        return SessionState()
    if not isinstance(doc, Mapping):
        _ignored("state", "not an object")
        return SessionState()
    return SessionState(
        camera=_part(doc, "camera", _camera),
        quality=_part(doc, "quality", _quality),
        edits=_part(doc, "edits", lambda value: _edits(value, base)) or SceneEdits(),
        upload=_part(doc, "upload", _upload),
    )


def _upload(doc: Mapping[str, Any]) -> dict[str, str]:
    scene, ticket = doc.get("scene"), doc.get("ticket")
    problem = upload_reference_problem(scene, ticket)
    if problem is not None:
        raise BadState(f"upload: {problem}")
    return {"scene": str(scene), "ticket": str(ticket)}  # both strings: checked above


def _part(doc: Mapping[str, Any], key: str, read: Any) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    try:
        if not isinstance(value, Mapping):
            raise BadState("not an object")
        return read(value)
    except BadState as exc:
        _ignored(key, str(exc))
    except Exception as exc:  # whatever else the wire brings: never the session's end
        _ignored(key, f"{type(exc).__name__}: {exc}")
    return None


def _ignored(part: str, reason: str) -> None:
    log.warning("session.state_ignored", extra={"part": part, "reason": reason[:200]})


def _number(doc: Mapping[str, Any], key: str, lo: float, hi: float) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadState(f"`{key}` must be a finite number")
    if not lo <= value <= hi:
        raise BadState(f"`{key}` must lie in [{lo:g}, {hi:g}]")
    return float(value)


def _camera(doc: Mapping[str, Any]) -> CameraPose:
    target = doc.get("target")
    if not isinstance(target, list) or len(target) != 3:
        raise BadState("`target` must be [x, y, z]")
    xyz = tuple(_number({"target": v}, "target", -MAX_TARGET, MAX_TARGET) for v in target)
    distance = _number(doc, "distance", 0.0, math.inf)
    if distance == 0:
        raise BadState("`distance` must be above 0")
    return CameraPose(
        _number(doc, "yaw", -MAX_ANGLE, MAX_ANGLE),
        _number(doc, "pitch", -MAX_ANGLE, MAX_ANGLE),
        distance,
        (xyz[0], xyz[1], xyz[2]),
    )


def _quality(doc: Mapping[str, Any]) -> QualityRequest:
    """What the page asked for, to be clamped to this worker's limits."""
    return QualityRequest(
        width=int(_number(doc, "width", 1, MAX_SIDE)),
        height=int(_number(doc, "height", 1, MAX_SIDE)),
        fps=_number(doc, "fps", 0.1, 1000),
        max_kbps=_number(doc, "maxKbps", 1, MAX_KBPS),
    )


def _edits(doc: Mapping[str, Any], base: Scene) -> SceneEdits:
    """Each material, hidden object and the hour on its own: an unknown name (another scene)
    or a bad figure leaves out that one, not the others."""
    edits = SceneEdits()
    materials = doc.get("materials") or []
    if not isinstance(materials, list):
        _ignored("edits.materials", "not a list")
        materials = []
    names = {m.name: i for i, m in enumerate(base.materials)}
    changed: dict[int, Material] = {}
    for entry in materials[: len(base.materials)]:
        try:
            index, material = _material(entry, names, base)
        except BadState as exc:
            _ignored("edits.materials", str(exc))
            continue
        changed[index] = material
    hidden: set[int] = set()
    objects = doc.get("hidden") or []
    if not isinstance(objects, list):
        _ignored("edits.hidden", "not a list")
        objects = []
    for name in objects[: len(base.objects)]:
        if isinstance(name, str) and name in base.objects:
            hidden.add(base.objects.index(name))
        else:
            _ignored("edits.hidden", f"no object {str(name)[:64]!r} in this scene")
    hours = None
    if doc.get("timeOfDay") is not None:
        try:
            hours = _number(doc, "timeOfDay", 0.0, HOURS_PER_DAY)
        except BadState as exc:
            _ignored("edits.timeOfDay", str(exc))
    return replace(edits, materials=changed, hidden=frozenset(hidden), hours=hours)


def _material(entry: Any, names: dict[str, int], base: Scene) -> tuple[int, Material]:
    if not isinstance(entry, Mapping):
        raise BadState("a material edit must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or name not in names:
        raise BadState(f"no material {str(name)[:64]!r} in this scene")
    color = entry.get("baseColor")
    if not isinstance(color, list) or len(color) != 3:
        raise BadState("`baseColor` must be [r, g, b]")
    r, g, b = (_number({"baseColor": c}, "baseColor", 0.0, 1.0) for c in color)
    index = names[name]
    material = replace(
        base.materials[index],
        base_color=(r, g, b),
        roughness=_number(entry, "roughness", 0.0, 1.0),
        metallic=_number(entry, "metallic", 0.0, 1.0),
    )
    return index, material


def restored_quality(
    request: QualityRequest | None, limits: QualityLimits, initial: StreamQuality
) -> StreamQuality:
    """The quality a moved session starts at: what its page asked for, within this worker's
    limits; figures equal to this worker's defaults are left as they are (not clamped to what
    a page may ask for)."""
    if request is None:
        return initial
    same_size = (request.width, request.height) == (
        initial.resolution.width,
        initial.resolution.height,
    )
    ask = QualityRequest(
        width=None if same_size else request.width,
        height=None if same_size else request.height,
        fps=None if request.fps == initial.fps else request.fps,
        max_kbps=None if request.max_kbps == initial.max_kbps else request.max_kbps,
    )
    return limits.clamp(initial, ask)
