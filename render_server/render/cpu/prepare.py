"""What the kernels read besides the frame buffers, computed on the host and shared by the CPU
renderer and the CUDA renderer (which uploads the same tables to the device).

`prepare_scene` gives a scene's tables and shadow map, built once per scene object and shared
by every renderer of it; `view_constants` gives a frame's view rays.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from render_server.render.camera import OrbitCamera
from render_server.render.cpu.lighting import light_params, material_table, tone_lut
from render_server.render.cpu.shadow_map import ShadowMap, draw_shadow_map, normal_offset
from render_server.render.scene import Scene

# Per-triangle row: corner normals, then corner shadow-map coordinates (u, v, depth)
TRIANGLE_WIDTH = 18
VIEW_WIDTH = 14  # view_constants: three ray terms, the eye, the floor


@dataclass(frozen=True)
class PreparedScene:
    """A scene's tables as the kernels read them (T triangles, M materials)."""

    positions: np.ndarray  # float32 (T, 3, 3)
    cull_back: np.ndarray  # uint8 (T,): 1 where the material is single sided
    material_ids: np.ndarray  # int32 (T,)
    triangles: np.ndarray  # float32 (T, TRIANGLE_WIDTH)
    materials: np.ndarray  # float32 (M + 1, MATERIAL_WIDTH): the scene's, then the floor's
    light: np.ndarray  # float32 (15,): see lighting.light_params
    shadow_matrix: np.ndarray  # float64 (3, 4): world → shadow map texel u, v and depth
    shadow_tiles: np.ndarray  # float32: the shadow map in overlapping tiles
    shadow_coarse: np.ndarray  # float32: the nearest occluder per block of the shadow map
    floor: tuple[float, float]  # the endless floor's height, its shadow normal offset
    lut: np.ndarray  # uint8 (LUT_SIZE,): linear radiance (by its square root) → sRGB byte


_lock = threading.Lock()
_cache: dict[int, tuple[weakref.ref[Scene], PreparedScene]] = {}


def prepare_scene(scene: Scene) -> PreparedScene:
    """The scene's tables; built at the first call for a scene object, then cached while it
    lives (so a scene must not change once drawn)."""
    with _lock:
        hit = _cache.get(id(scene))
        if hit is not None and hit[0]() is scene:
            return hit[1]
        prepared = _build(scene)
        _cache[id(scene)] = (weakref.ref(scene), prepared)
        weakref.finalize(scene, _cache.pop, id(scene), None)
        return prepared


def view_constants(
    camera: OrbitCamera, width: int, height: int, floor: tuple[float, float]
) -> np.ndarray:
    """The shading kernel's view constants: ray terms, eye, floor (float64 (VIEW_WIDTH,)).

    The world view ray through pixel (i, j) is r0 + i·ri + j·rj (not normalized).
    """
    view = camera.view_matrix()
    right, up, back = view[0, :3], view[1, :3], view[2, :3]
    tan_y = math.tan(camera.fov_y / 2)
    tan_x = tan_y * width / height
    r0 = -back + (1.0 / width - 1.0) * tan_x * right + (1.0 - 1.0 / height) * tan_y * up
    ri = 2.0 / width * tan_x * right
    rj = -2.0 / height * tan_y * up
    return np.concatenate([r0, ri, rj, camera.eye(), floor])


def _build(scene: Scene) -> PreparedScene:
    double = np.array([m.double_sided for m in scene.materials], dtype=bool)
    to_light = -scene.light_direction.astype(np.float64)
    shadow = draw_shadow_map(scene, to_light)
    up = np.array([0.0, 1.0, 0.0])
    floor_offset = float(normal_offset(up, to_light, shadow.texel, False)[1])
    return PreparedScene(
        positions=scene.positions,
        cull_back=(~double[scene.material_ids]).astype(np.uint8),
        material_ids=scene.material_ids,
        triangles=_triangle_table(scene, to_light, shadow, double[scene.material_ids]),
        materials=material_table(scene),
        light=light_params(to_light, scene.light_color, scene.daylight),
        shadow_matrix=shadow.to_map,
        shadow_tiles=shadow.tiles,
        shadow_coarse=shadow.coarse,
        floor=(float(scene.bounds_min[1]), floor_offset),
        lut=tone_lut(),
    )


def _triangle_table(
    scene: Scene, to_light: np.ndarray, shadow: ShadowMap, double_sided: np.ndarray
) -> np.ndarray:
    """Per triangle: its corner normals, then its corners' shadow-map coordinates."""
    triangles = np.zeros((scene.triangle_count, TRIANGLE_WIDTH), dtype=np.float32)
    normals = scene.normals.astype(np.float64)
    triangles[:, 0:9] = normals.reshape(-1, 9)
    # Normal-offset shadow lookups: move each corner off its surface, more where the light
    # grazes it (where acne starts), and toward the lit side of double-sided surfaces.
    world = scene.positions.astype(np.float64) + normal_offset(
        normals, to_light, shadow.texel, double_sided[:, None]
    )
    uvd = np.c_[world.reshape(-1, 3), np.ones(world.shape[0] * 3)] @ shadow.to_map.T
    triangles[:, 9:18] = uvd.reshape(-1, 9)
    return triangles
