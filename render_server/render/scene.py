"""The scene every renderer draws: world-space triangles, their materials and one sun.

Loading scenes from files is `scene_files`; the built-in scenes are `builtin_scenes`.
"""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field

import numpy as np

# one class for the loaders, the upload checks and the renderers; importable from here as before
from render_server.scene_formats.errors import SceneError as SceneError

DEFAULT_LIGHT_DIRECTION = (0.27, -0.77, -0.58)  # travels down and away from the default view
DEFAULT_LIGHT_COLOR = (1.0, 0.95, 0.86)  # linear RGB, warm white sun


@dataclass(frozen=True)
class Material:
    """A metallic-roughness surface; `base_color` is linear RGB in 0..1."""

    name: str
    base_color: tuple[float, float, float]
    roughness: float
    metallic: float
    double_sided: bool


# The renderers draw an endless floor of this material below the scene; the default scene's
# ground plate has it too, so the plate merges into the floor.
FLOOR_MATERIAL = Material("floor", (0.45, 0.43, 0.4), 0.85, 0.0, False)


@dataclass
class Scene:
    """Triangles in world space with per-corner normals, their materials and a directional sun.

    `light_direction` is the unit vector the sunlight travels along (pointing down for a sun
    above); `light_color` is its linear RGB intensity. `objects` names the scene's parts (the
    node names of a glTF/OBJ file) and `object_ids` gives each triangle's part; without them
    the whole scene is one object, "scene". The bounds are derived from the positions, or given
    as `bounds` (min, max): a scene derived from another (some objects hidden) keeps its
    parent's bounds, and only with given bounds may a scene hold no triangles at all.
    """

    positions: np.ndarray  # float32 (T, 3, 3): triangle corners, counter-clockwise is the front
    normals: np.ndarray  # float32 (T, 3, 3): unit shading normal per corner
    material_ids: np.ndarray  # int32 (T,): index into `materials`
    materials: list[Material]
    light_direction: np.ndarray = field(
        default_factory=lambda: np.array(DEFAULT_LIGHT_DIRECTION, dtype=np.float32)
    )
    light_color: tuple[float, float, float] = DEFAULT_LIGHT_COLOR
    daylight: float = 1.0  # how bright the sky and its ambient light are: 1 day … 0 night
    objects: list[str] = field(default_factory=lambda: ["scene"])
    object_ids: np.ndarray | None = None  # int32 (T,): index into `objects`; None: all 0
    bounds: InitVar[tuple[np.ndarray, np.ndarray] | None] = None
    bounds_min: np.ndarray = field(init=False)  # float32 (3,)
    bounds_max: np.ndarray = field(init=False)  # float32 (3,)

    def __post_init__(self, bounds: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.positions = np.ascontiguousarray(self.positions, dtype=np.float32)
        self.normals = np.ascontiguousarray(self.normals, dtype=np.float32)
        self.material_ids = np.ascontiguousarray(self.material_ids, dtype=np.int32)
        count = self.positions.shape[0] if self.positions.ndim == 3 else -1
        if count < (0 if bounds is not None else 1) or self.positions.shape != (count, 3, 3):
            raise SceneError(f"positions must be (T, 3, 3) with T > 0, got {self.positions.shape}")
        if self.normals.shape != (count, 3, 3):
            raise SceneError(f"normals must be {(count, 3, 3)}, got {self.normals.shape}")
        if self.material_ids.shape != (count,):
            raise SceneError(f"material_ids must be ({count},), got {self.material_ids.shape}")
        if not np.isfinite(self.positions).all():
            raise SceneError("positions hold non-finite coordinates")
        if not np.isfinite(self.normals).all():
            raise SceneError("normals hold non-finite values")
        length = np.linalg.norm(self.normals, axis=2)
        if count and np.abs(length - 1.0).max() > 1e-3:
            raise SceneError("normals must be unit vectors")
        if not self.materials:
            raise SceneError("a scene needs at least one material")
        if count and (
            self.material_ids.min() < 0 or self.material_ids.max() >= len(self.materials)
        ):
            raise SceneError(f"material_ids must lie in [0, {len(self.materials)})")
        if not self.objects or not all(isinstance(name, str) for name in self.objects):
            raise SceneError("objects must be a non-empty list of names")
        ids = np.zeros(count, np.int32) if self.object_ids is None else self.object_ids
        self.object_ids = np.ascontiguousarray(ids, dtype=np.int32)
        if self.object_ids.shape != (count,):
            raise SceneError(f"object_ids must be ({count},), got {self.object_ids.shape}")
        if count and (self.object_ids.min() < 0 or self.object_ids.max() >= len(self.objects)):
            raise SceneError(f"object_ids must lie in [0, {len(self.objects)})")
        light = np.asarray(self.light_direction, dtype=np.float64).reshape(3)
        norm = float(np.linalg.norm(light))
        if not math.isfinite(norm) or norm < 1e-9:
            raise SceneError("light_direction must be a finite non-zero vector")
        self.light_direction = (light / norm).astype(np.float32)
        if len(self.light_color) != 3 or not all(math.isfinite(c) for c in self.light_color):
            raise SceneError("light_color must be three finite numbers")
        if bounds is not None:
            lo, hi = (np.asarray(b, dtype=np.float32).reshape(3) for b in bounds)
            if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo <= hi).all()):
                raise SceneError("bounds must be finite with min <= max")
            self.bounds_min, self.bounds_max = lo, hi
        else:
            self.bounds_min = self.positions.reshape(-1, 3).min(axis=0)
            self.bounds_max = self.positions.reshape(-1, 3).max(axis=0)

    @property
    def triangle_count(self) -> int:
        return int(self.positions.shape[0])


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in 0..1 → linear values."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in 0..1 → sRGB-encoded values (the inverse of `srgb_to_linear`)."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)
