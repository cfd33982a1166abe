"""Scene commands from the data channel: the camera, materials, visibility and time of day.

Each session keeps its own edits and derives its own `Scene` from the worker's base scene,
which is never changed: one designer's edit never shows in another session. Arguments are
checked strictly (types, ranges, names of at most 64 characters, no unknown keys); a refused
command changes nothing. docs/data-channel.md describes every command.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np

from render_server.protocol.data_channel import MAX_NAME_CHARS, CommandError, SceneCommand
from render_server.render.camera import MAX_PITCH, OrbitCamera
from render_server.render.scene import Material, Scene, linear_to_srgb, srgb_to_linear
from render_server.render.sun import DEFAULT_HOUR, HOURS_PER_DAY, daylight_for_hour, light_for_hour
from render_server.stream.controls import CameraController

READ_ONLY: Final = frozenset({"getCamera", "listScene"})  # what a viewer may send
MAX_TARGET: Final = 1e6  # world units: a camera target further out is a mistake
MAX_ANGLE: Final = 1e3  # radians: any angle is taken modulo a turn, but not nonsense
_COLOR = re.compile(r"#[0-9a-fA-F]{6}")


@dataclass(frozen=True)
class SceneEdits:
    """A session's edits to the base scene: material overrides, hidden objects, time of day."""

    materials: Mapping[int, Material] = field(default_factory=dict)
    hidden: frozenset[int] = frozenset()
    hours: float | None = None  # None: the scene's own light

    def apply(self, base: Scene) -> Scene:
        """A new scene: `base` with these edits; hidden objects' triangles left out.

        It keeps the base scene's bounds, so the floor, the shadow map's extent and the camera's
        clip planes stay where they were however many objects are hidden (even all of them).
        """
        if not self.materials and not self.hidden and self.hours is None:
            return base
        assert base.object_ids is not None  # Scene fills it in
        keep: Any = slice(None)
        if self.hidden:
            keep = ~np.isin(base.object_ids, np.fromiter(self.hidden, np.int32))
        materials = [self.materials.get(i, m) for i, m in enumerate(base.materials)]
        light_direction, light_color = base.light_direction, base.light_color
        daylight = base.daylight
        if self.hours is not None:
            light_direction, light_color = light_for_hour(self.hours)
            daylight = daylight_for_hour(self.hours)
        return Scene(
            positions=base.positions[keep],
            normals=base.normals[keep],
            material_ids=base.material_ids[keep],
            materials=materials,
            light_direction=light_direction,
            light_color=light_color,
            daylight=daylight,
            objects=base.objects,
            object_ids=base.object_ids[keep],
            bounds=(base.bounds_min, base.bounds_max),
        )


class SceneCommands:
    """One session's command handler: `execute` answers a command with a JSON-ready reply.

    `on_scene` receives a zero-argument function that builds the edited scene; the session
    hands it to the pipeline, which builds it on the session's thread at the next frame (only
    the newest one, however many edits came in between).
    """

    def __init__(
        self,
        base: Scene,
        controller: CameraController,
        on_scene: Callable[[Callable[[], Scene]], None] | None = None,
    ) -> None:
        self.controller = controller
        self.edits = SceneEdits()
        self._on_scene = on_scene
        self._take_base(base)
        self._handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
            "getCamera": self._get_camera,
            "setCamera": self._set_camera,
            "resetCamera": self._reset_camera,
            "listScene": self._list_scene,
            "setMaterial": self._set_material,
            "setVisible": self._set_visible,
            "setTimeOfDay": self._set_time_of_day,
            "loadScene": self._load_scene,
        }
        # `loadScene`'s handler (stream/scene_loading.py): None where the worker has no
        # source of uploaded scenes
        self.loader: Callable[[dict[str, Any]], dict[str, Any]] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    def execute(self, command: SceneCommand, role: str = "controller") -> dict[str, Any]:
        """The `result` or `error` message that answers `command` from a peer of `role`."""
        try:
            value = self.run(command, role)
        except CommandError as exc:
            return error_reply(exc, command.id)
        return {"type": "result", "id": command.id, "name": command.name, "value": value}

    def run(self, command: SceneCommand, role: str = "controller") -> Any:
        """The command's value; CommandError when it is refused."""
        handler = self._handlers.get(command.name)
        if handler is None:
            raise CommandError(
                "unknown_command",
                f"unknown command {command.name!r}; known: {', '.join(self._handlers)}",
                command.id,
            )
        if role != "controller" and command.name not in READ_ONLY:
            raise CommandError(
                "forbidden",
                f"a viewer may only send {', '.join(sorted(READ_ONLY))}",
                command.id,
            )
        try:
            return handler(command.args)
        except CommandError as exc:
            exc.id = command.id
            raise

    def restore(self, edits: SceneEdits) -> None:
        """Start from `edits` (a session that moved here from another worker)."""
        if edits != self.edits:
            self._edit(edits)

    def replace_base(self, base: Scene) -> None:
        """Draw `base` from the next frame on (an uploaded scene): the edits, made to the old
        scene's objects and materials, are dropped, and the camera is framed on it."""
        self._take_base(base)
        self.controller.frame(base.bounds_min, base.bounds_max)
        self.edits = SceneEdits()
        if self._on_scene is not None:
            self._on_scene(lambda: base)

    def _take_base(self, base: Scene) -> None:
        self.base = base
        self._default_hour = _hour_of(base)
        self._object_material = _object_materials(base)

    def scene(self) -> Scene:
        """The session's scene now: the base scene with its edits."""
        return self.edits.apply(self.base)

    # -- camera ----------------------------------------------------------------------------

    def _get_camera(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ())
        return camera_value(self.controller.camera)

    def _set_camera(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ("yaw", "pitch", "distance", "target"))
        yaw = _number(args, "yaw", -MAX_ANGLE, MAX_ANGLE)
        pitch = _number(args, "pitch", -MAX_ANGLE, MAX_ANGLE)
        distance = _number(args, "distance", 0.0, math.inf, open_low=True)
        target = args.get("target")
        if target is not None:
            if not isinstance(target, list) or len(target) != 3:
                raise CommandError("bad_command", "`target` must be [x, y, z]")
            target = tuple(
                _number({"target": v}, "target", -MAX_TARGET, MAX_TARGET) for v in target
            )
        # checked all first: a refused command changes nothing
        place_camera(self.controller.camera, yaw, pitch, distance, target)
        return camera_value(self.controller.camera)

    def _reset_camera(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ())
        self.controller.reset()
        return camera_value(self.controller.camera)

    # -- scene -----------------------------------------------------------------------------

    def _load_scene(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.loader is None:
            raise CommandError(
                "unavailable", "this worker has no source of uploaded scenes (docs/scenes.md)"
            )
        return self.loader(args)

    def _list_scene(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ())
        materials = [self.edits.materials.get(i, m) for i, m in enumerate(self.base.materials)]
        objects = [
            {
                "name": name,
                "visible": i not in self.edits.hidden,
                "material": (
                    materials[self._object_material[i]].name
                    if self._object_material[i] >= 0
                    else None
                ),
            }
            for i, name in enumerate(self.base.objects)
        ]
        return {
            "objects": objects,
            "materials": [material_value(m) for m in materials],
            "timeOfDay": self.edits.hours if self.edits.hours is not None else self._default_hour,
        }

    def _set_material(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ("material", "color", "roughness", "metallic"))
        index = self._material_index(_name(args, "material"))
        current = self.edits.materials.get(index, self.base.materials[index])
        color = args.get("color")
        if color is not None and (not isinstance(color, str) or not _COLOR.fullmatch(color)):
            raise CommandError("bad_command", '`color` must be "#rrggbb" (sRGB)')
        roughness = _number(args, "roughness", 0.0, 1.0)
        metallic = _number(args, "metallic", 0.0, 1.0)
        changed = current
        if color is not None:
            srgb = np.array([int(color[k : k + 2], 16) for k in (1, 3, 5)]) / 255.0
            r, g, b = (float(c) for c in srgb_to_linear(srgb))
            changed = replace(changed, base_color=(r, g, b))
        if roughness is not None:
            changed = replace(changed, roughness=roughness)
        if metallic is not None:
            changed = replace(changed, metallic=metallic)
        if changed != current:
            self._edit(replace(self.edits, materials={**self.edits.materials, index: changed}))
        return material_value(changed)

    def _set_visible(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ("object", "visible"))
        name = _name(args, "object")
        try:
            index = self.base.objects.index(name)
        except ValueError:
            raise CommandError("bad_command", f"no object {name!r}; listScene names them") from None
        visible = args.get("visible")
        if not isinstance(visible, bool):
            raise CommandError("bad_command", "`visible` must be true or false")
        hidden = self.edits.hidden - {index} if visible else self.edits.hidden | {index}
        if hidden != self.edits.hidden:
            self._edit(replace(self.edits, hidden=frozenset(hidden)))
        return {"name": name, "visible": visible}

    def _set_time_of_day(self, args: dict[str, Any]) -> dict[str, Any]:
        _only(args, ("hours",))
        hours = _number(args, "hours", 0.0, HOURS_PER_DAY)
        if hours is None:
            raise CommandError("bad_command", "`hours` is required")
        if hours != self.edits.hours:
            self._edit(replace(self.edits, hours=hours))
        return {"timeOfDay": hours}

    def _material_index(self, name: str) -> int:
        for i, material in enumerate(self.base.materials):
            if material.name == name:
                return i
        raise CommandError("bad_command", f"no material {name!r}; listScene names them")

    def _edit(self, edits: SceneEdits) -> None:
        self.edits = edits
        if self._on_scene is not None:
            base = self.base
            self._on_scene(lambda: edits.apply(base))


def place_camera(
    cam: OrbitCamera,
    yaw: float | None = None,
    pitch: float | None = None,
    distance: float | None = None,
    target: tuple[float, ...] | None = None,
) -> None:
    """Put the camera at the figures given (checked), within its own limits: `setCamera`'s, and
    a moved session's start (stream/state.py)."""
    if yaw is not None:
        cam.yaw = math.remainder(yaw, 2 * math.pi)
    if pitch is not None:
        cam.pitch = min(max(pitch, -MAX_PITCH), MAX_PITCH)
    if distance is not None:
        cam.distance = min(max(distance, cam.min_distance), cam.max_distance)
    if target is not None:
        cam.target = (float(target[0]), float(target[1]), float(target[2]))


def error_reply(exc: CommandError, id: int | None) -> dict[str, Any]:
    return {"type": "error", "id": id, "code": exc.code, "message": exc.message}


def camera_value(cam: OrbitCamera) -> dict[str, Any]:
    return {
        "yaw": cam.yaw,
        "pitch": cam.pitch,
        "distance": cam.distance,
        "target": [float(v) for v in cam.target],
    }


def material_value(material: Material) -> dict[str, Any]:
    srgb = np.rint(linear_to_srgb(np.asarray(material.base_color)) * 255).astype(int)
    return {
        "name": material.name,
        "color": "#{:02x}{:02x}{:02x}".format(*srgb),
        "roughness": material.roughness,
        "metallic": material.metallic,
    }


def _object_materials(scene: Scene) -> np.ndarray:
    """Each object's material: that of its first triangle (-1: an object without any)."""
    assert scene.object_ids is not None
    materials = np.full(len(scene.objects), -1, dtype=np.int64)
    ids = scene.object_ids[::-1]  # reversed: the first triangle's assignment wins
    materials[ids] = scene.material_ids[::-1]
    return materials


def _hour_of(scene: Scene) -> float | None:
    """The hour whose sun lights `scene`, when it is lit as the model lights that hour."""
    direction, color = light_for_hour(DEFAULT_HOUR)
    if np.allclose(scene.light_direction, direction, atol=1e-4) and np.allclose(
        scene.light_color, color, atol=1e-4
    ):
        return DEFAULT_HOUR
    return None


def _only(args: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no arguments"
        raise CommandError("bad_command", f"unknown argument {unknown[0][:64]!r}; takes {takes}")


def _name(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise CommandError("bad_command", f"`{key}` must be a name of 1..{MAX_NAME_CHARS} chars")
    return value


def _number(
    args: dict[str, Any], key: str, lo: float, hi: float, open_low: bool = False
) -> float | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CommandError("bad_command", f"`{key}` must be a finite number")
    if value < lo or value > hi or (open_low and value == lo):
        low = "(" if open_low else "["
        raise CommandError("bad_command", f"`{key}` must lie in {low}{lo:g}, {hi:g}]")
    return float(value)
