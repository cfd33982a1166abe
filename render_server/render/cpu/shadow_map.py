"""The sun's shadow map, drawn once per scene: the scene and the sun never move.

The visibility pass draws the scene as the sun sees it into a SHADOW_SIZE² depth map. The
shading kernel reads it as overlapping tiles (`tile`, for cache locality) and first asks a
coarse map of the nearest occluder per block (`coarse`), which spares most lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from render_server.render.cpu.raster import EMPTY_DEPTH, PLANE_WIDTH, visibility
from render_server.render.cpu.shading import COARSE, SHADOW_SIZE, TILE, TILE_STEP
from render_server.render.scene import Scene

SHADOW_BORDER = 2  # texels left empty around the shadow map: lookups clamped to it see light


@dataclass(frozen=True)
class ShadowMap:
    """The sun's depth map as the shading kernel reads it, and how to look points up in it."""

    tiles: np.ndarray  # float32, flat: the map in overlapping tiles, see `tile`
    coarse: np.ndarray  # float32, flat: the nearest occluder per block, see `coarse`
    to_map: np.ndarray  # float64 (3, 4): world → texel u, v and depth (1 − z, plus a bias)
    texel: float  # a texel's width in world units


def draw_shadow_map(scene: Scene, to_light: np.ndarray) -> ShadowMap:
    """The shadow map of `scene` lit from direction `to_light` (unit, toward the sun)."""
    light_vp, texel = light_projection(scene, to_light)
    shadow_map = np.empty((SHADOW_SIZE, SHADOW_SIZE), dtype=np.float32)
    visibility(
        scene.positions,
        np.zeros(scene.triangle_count, np.uint8),  # both faces cast shadows
        light_vp,
        shadow_map,
        np.empty((SHADOW_SIZE, SHADOW_SIZE), dtype=np.int32),
        np.zeros((scene.triangle_count, PLANE_WIDTH), dtype=np.float64),
        np.empty(SHADOW_SIZE, dtype=np.int32),
        np.empty(SHADOW_SIZE, dtype=np.int32),
    )
    shadow_map[:SHADOW_BORDER] = shadow_map[-SHADOW_BORDER:] = EMPTY_DEPTH
    shadow_map[:, :SHADOW_BORDER] = shadow_map[:, -SHADOW_BORDER:] = EMPTY_DEPTH

    # the bias keeps a lit surface from shadowing itself where its depth varies within a texel
    depth_bias = 0.3 * texel * float(np.linalg.norm(light_vp[2, :3]))
    to_map = (np.diag([0.5 * SHADOW_SIZE, -0.5 * SHADOW_SIZE, -1.0, 1.0]) @ light_vp)[:3]
    to_map[:, 3] += (0.5 * SHADOW_SIZE, 0.5 * SHADOW_SIZE, 1.0 + depth_bias)
    return ShadowMap(tile(shadow_map), coarse(shadow_map), to_map, texel)


def normal_offset(
    normals: np.ndarray, to_light: np.ndarray, texel: float, double_sided: np.ndarray | bool
) -> np.ndarray:
    """How far to move surface points along their normals before a shadow-map lookup."""
    cos_l = normals @ to_light
    toward = np.where(double_sided & (cos_l < 0), -1.0, 1.0)
    sin_l = np.sqrt(np.clip(1.0 - cos_l**2, 0.0, 1.0))
    result: np.ndarray = (texel * (0.6 + 1.6 * sin_l) * toward)[..., None] * normals
    return result


def light_projection(scene: Scene, to_light: np.ndarray) -> tuple[np.ndarray, float]:
    """Orthographic world → clip matrix of the sun that holds the scene, and its texel size."""
    forward = -to_light
    helper = np.array([0.0, 0.0, 1.0]) if abs(forward[1]) > 0.99 else np.array([0.0, 1.0, 0.0])
    right = np.cross(forward, helper)
    right /= np.linalg.norm(right)
    up = np.cross(right, forward)
    corners = np.array(np.meshgrid(*zip(scene.bounds_min, scene.bounds_max, strict=True)))
    corners = corners.T.reshape(-1, 3).astype(np.float64)
    x, y, z = corners @ right, corners @ up, corners @ forward
    extent = max(float(np.ptp(x)), float(np.ptp(y)), 1e-6)
    pad = extent * (SHADOW_BORDER + 1) / (SHADOW_SIZE - 2 * SHADOW_BORDER - 2)
    x0, x1 = x.min() - pad, x.max() + pad
    y0, y1 = y.min() - pad, y.max() + pad
    z0, z1 = z.min() - pad, z.max() + pad
    m = np.zeros((4, 4))
    m[0, :3], m[0, 3] = right * 2 / (x1 - x0), -(x1 + x0) / (x1 - x0)
    m[1, :3], m[1, 3] = up * 2 / (y1 - y0), -(y1 + y0) / (y1 - y0)
    m[2, :3], m[2, 3] = forward * 2 / (z1 - z0), -(z1 + z0) / (z1 - z0)  # −1 nearest the sun
    m[3, 3] = 1.0
    return m, max(x1 - x0, y1 - y0) / SHADOW_SIZE


def tile(shadow_map: np.ndarray) -> np.ndarray:
    """The shadow map as TILE×TILE tiles, each starting TILE_STEP texels after the last, flat."""
    size = shadow_map.shape[0]
    tiles = (size - 2) // TILE_STEP + 1
    span = (tiles - 1) * TILE_STEP + TILE
    padded = np.full((span, span), EMPTY_DEPTH, dtype=np.float32)
    padded[:size, :size] = shadow_map
    out = np.empty((tiles, tiles, TILE, TILE), dtype=np.float32)
    for oy in range(TILE):
        for ox in range(TILE):
            out[:, :, oy, ox] = padded[oy : oy + tiles * TILE_STEP : TILE_STEP,
                                       ox : ox + tiles * TILE_STEP : TILE_STEP]  # fmt: skip
    return out.reshape(-1)


def coarse(shadow_map: np.ndarray) -> np.ndarray:
    """The nearest occluder depth in each COARSE×COARSE block and its one-texel rim, flat.

    A receiver at least that near to the sun is lit wherever its 2×2 footprint falls in the
    block: most of a frame needs no lookup in the full map, whose misses cost most.
    """
    size = shadow_map.shape[0]
    blocks = -(-size // COARSE)
    padded = np.full((blocks * COARSE + 2, blocks * COARSE + 2), EMPTY_DEPTH, np.float32)
    padded[1 : size + 1, 1 : size + 1] = shadow_map
    # dilate by one texel each way, so a footprint that reaches into the next block counts
    grown = padded.copy()
    for dy in (0, 1, 2):
        for dx in (0, 1, 2):
            shifted = padded[dy : dy + blocks * COARSE, dx : dx + blocks * COARSE]
            np.maximum(grown[1:-1, 1:-1], shifted, out=grown[1:-1, 1:-1])
    inner = grown[1:-1, 1:-1].reshape(blocks, COARSE, blocks, COARSE)
    return np.asarray(inner.max(axis=(1, 3)).reshape(-1), dtype=np.float32)
