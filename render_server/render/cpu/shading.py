"""The CPU renderer: a numba-compiled rasterizer that draws the scene on one core.

A frame is two passes. The visibility pass clips and rasterizes every triangle into a depth
buffer and a triangle-id buffer. The shading pass then lights each pixel once from its triangle
id, so its cost does not grow with overdraw. Barycentrics come from the triangle's 2D-homogeneous
matrix (the inverse of its clip-space x, y, w columns): they are perspective-correct and refer to
the original triangle however the clipper cut it, so the clipper carries no attributes.
Shadows come from a shadow map drawn once per scene, since the scene and the sun never move.
Where the view misses the scene below the horizon it meets an endless floor at the scene's
lowest point, lit and shadowed like the rest.

The kernels are written for LLVM's loop vectorizer: hot loops are branch-free, index arrays
with unsigned integers (numba's wrap-around of negative indices turns loads into gathers) and
keep to 32-bit lanes (64-bit lanes need 512-bit registers, which run far slower here).
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit

from render_server.render.bands import run_in_bands, split_rows
from render_server.render.camera import OrbitCamera
from render_server.render.scene import FLOOR_MATERIAL, Scene

SUBPIXEL = 256  # 8 bits of sub-pixel precision in the fixed-point edge functions
GUARD_BAND = 16.0  # clip |x|, |y| beyond 16·w so edge products stay far inside int64
SPAN_MIN_WIDTH = 12  # wider triangles are filled by exact per-row spans, narrower by edge tests
EMPTY_DEPTH = np.float32(-3.0e38)  # depth grows toward the viewer; finite so fastmath stays sound
SHADOW_SIZE = 1024
SHADOW_BORDER = 2  # texels left empty around the shadow map: lookups clamped to it see light
TILE = 8  # the shadow map is stored in 8×8 tiles (4 cache lines) that overlap by one texel,
TILE_STEP = 7  # so a 2×2 footprint never leaves its tile and a walk across the map stays local
COARSE = 32  # texels per side of a block of the coarse shadow map (see _coarse)
LANES = 8  # the lighting loop's unit of work: LLVM vectorizes it 8 floats wide
LUT_SIZE = 4096
LUT_MAX = 16.0  # linear radiance at or above this is white
EXPOSURE = 0.6

# Lighting constants, linear RGB. The sky gradient is also what glossy surfaces reflect.
SKY_ZENITH = (0.2, 0.38, 0.78)
SKY_HORIZON = (0.78, 0.84, 0.92)
AMBIENT_SKY = (0.3, 0.36, 0.45)
AMBIENT_GROUND = (0.12, 0.11, 0.1)
FLOOR = FLOOR_MATERIAL  # the endless floor below the horizon
NIGHT_SKY = 0.04  # what is left of the sky's brightness at night (Scene.daylight 0)
SUNSET = (0.95, 0.5, 0.3)  # the horizon's tint at dusk


def _sky_scale(daylight: float) -> float:
    return NIGHT_SKY + (1.0 - NIGHT_SKY) * min(max(daylight, 0.0), 1.0)


# Per-material row of the shading table, with the sun and ambient light folded in: sun ×
# diffuse, sun × F0, the hemisphere ambient a + b·up (a, b), the environment's Fresnel
# F0 + g·(1 − n·v)⁵ (F0, g), GGX alpha², roughness, and how sharp the reflected horizon is.
_MATERIAL_WIDTH = 21
# Per-triangle row: corner normals, then corner shadow-map coordinates (u, v, depth)
_TRIANGLE_WIDTH = 18


class CpuRenderer:
    """Draws `scene` at `width` × `height` on the calling thread (numba releases the GIL).

    `render` returns a frame buffer owned by the renderer and overwritten by the next call.
    One renderer serves one thread at a time; create one per session. A scene object must not
    change once drawn: its tables and shadow map are built once per scene object and shared.
    To show an edited scene, build a new `Scene` and hand it to `set_scene`.
    """

    def __init__(self, scene: Scene, width: int, height: int, bands: int | None = None) -> None:
        if not (1 <= width <= 8192 and 1 <= height <= 8192):
            raise ValueError(f"frame size {width}x{height} is outside 1..8192")
        self._bands = split_rows(height, bands)
        self.width = width
        self.height = height
        self.set_scene(scene)
        self._depth = np.empty((height, width), dtype=np.float32)
        self._ids = np.empty((height, width), dtype=np.int32)
        self._row_lo = np.empty(height, dtype=np.int32)
        self._row_hi = np.empty(height, dtype=np.int32)
        self._frame = np.empty((height, width, 3), dtype=np.uint8)

    def set_scene(self, scene: Scene) -> None:
        """Draw `scene` from the next frame on (its tables are built here unless cached)."""
        prepared = _prepare(scene)
        self.scene = scene
        self._prepared = prepared
        self._planes = np.zeros((scene.triangle_count, 10), dtype=np.float64)

    def render(self, camera: OrbitCamera) -> np.ndarray:
        """The frame for `camera`: (height, width, 3) uint8 sRGB, reused by the next call."""
        p = self._prepared
        _visibility(
            p.positions, p.cull_back, camera.view_projection(self.width / self.height),
            self._depth, self._ids, self._planes, self._row_lo, self._row_hi,
        )  # fmt: skip
        view = _view(camera, self.width, self.height, p.floor)

        def shade(start: int, stop: int) -> None:
            _shade(
                self._ids, self._planes, p.triangles, p.material_ids, p.materials, view,
                p.light, p.shadow_matrix, p.shadow_tiles, p.shadow_coarse, p.lut, self._row_lo,
                self._row_hi, self._frame, start, stop,
            )  # fmt: skip

        # the shading pass (three quarters of a frame) in bands of rows at once
        run_in_bands(shade, self._bands)
        return self._frame


def coverage(triangles_ndc: np.ndarray, width: int, height: int) -> np.ndarray:
    """How many of the given 2D triangles (N, 3, 2 in NDC, y up) cover each pixel, (H, W).

    Each triangle goes through the visibility pass on its own, so the counts show the fill rule:
    triangles that share an edge must cover every pixel along it exactly once.
    """
    tris = np.asarray(triangles_ndc, dtype=np.float32).reshape(-1, 3, 2)
    counts = np.zeros((height, width), dtype=np.int32)
    depth = np.empty((height, width), dtype=np.float32)
    ids = np.empty((height, width), dtype=np.int32)
    row_lo = np.empty(height, dtype=np.int32)
    row_hi = np.empty(height, dtype=np.int32)
    vp = np.eye(4)
    vp[2, 2] = 0.0  # z = 0: every corner sits mid-depth, none is clipped
    for tri in tris:
        positions = np.zeros((1, 3, 3), dtype=np.float32)
        positions[0, :, :2] = tri
        planes = np.zeros((1, 10), dtype=np.float64)
        _visibility(positions, np.zeros(1, np.uint8), vp, depth, ids, planes, row_lo, row_hi)
        counts += ids >= 0
    return counts


# -- per-scene preparation, shared by every renderer of a scene ------------------------------------


@dataclass
class _Prepared:
    positions: np.ndarray  # float32 (T, 3, 3)
    cull_back: np.ndarray  # uint8 (T,): 1 where the material is single sided
    material_ids: np.ndarray  # int32 (T,)
    triangles: np.ndarray  # float32 (T, _TRIANGLE_WIDTH)
    materials: np.ndarray  # float32 (M + 1, _MATERIAL_WIDTH): the scene's, then FLOOR
    light: np.ndarray  # float32 (15,): see _light_params
    shadow_matrix: np.ndarray  # float64 (3, 4): world → shadow map texel u, v and depth
    shadow_tiles: np.ndarray  # float32: the shadow map in overlapping tiles, see _tile
    shadow_coarse: np.ndarray  # float32: the nearest occluder per block, see _coarse
    floor: tuple[float, float]  # the endless floor's height, its shadow normal offset
    lut: np.ndarray  # uint8 (LUT_SIZE,): linear radiance (by its square root) → sRGB byte


_prepared_lock = threading.Lock()
_prepared_cache: dict[int, tuple[weakref.ref[Scene], _Prepared]] = {}


def _prepare(scene: Scene) -> _Prepared:
    """Per-scene tables and the shadow map, computed once per scene object."""
    with _prepared_lock:
        hit = _prepared_cache.get(id(scene))
        if hit is not None and hit[0]() is scene:
            return hit[1]
        prepared = _build_prepared(scene)
        _prepared_cache[id(scene)] = (weakref.ref(scene), prepared)
        weakref.finalize(scene, _prepared_cache.pop, id(scene), None)
        return prepared


def _build_prepared(scene: Scene) -> _Prepared:
    sun = np.asarray(scene.light_color, dtype=np.float64)
    dim = _sky_scale(scene.daylight)
    sky, ground = dim * np.asarray(AMBIENT_SKY), dim * np.asarray(AMBIENT_GROUND)
    materials = np.zeros((len(scene.materials) + 1, _MATERIAL_WIDTH), dtype=np.float32)
    for i, m in enumerate([*scene.materials, FLOOR]):
        base = np.asarray(m.base_color, dtype=np.float64)
        diffuse = base * (1.0 - m.metallic)
        f0 = 0.04 * (1.0 - m.metallic) + base * m.metallic
        alpha = max(m.roughness, 0.06) ** 2  # a perfect mirror would sparkle without AA
        materials[i, 0:3] = sun * diffuse
        materials[i, 3:6] = sun * f0
        materials[i, 6:9] = diffuse * ground
        materials[i, 9:12] = diffuse * (sky - ground)
        materials[i, 12:15] = f0
        materials[i, 15:18] = np.maximum(1.0 - m.roughness, f0) - f0
        materials[i, 18] = alpha * alpha
        materials[i, 19] = m.roughness
        materials[i, 20] = 8.0 - 6.0 * m.roughness
    double = np.array([m.double_sided for m in scene.materials], dtype=bool)
    cull_back = (~double[scene.material_ids]).astype(np.uint8)

    to_light = -scene.light_direction.astype(np.float64)
    light_vp, texel = _light_projection(scene, to_light)
    shadow_map = np.empty((SHADOW_SIZE, SHADOW_SIZE), dtype=np.float32)
    _visibility(
        scene.positions,
        np.zeros(scene.triangle_count, np.uint8),  # both faces cast shadows
        light_vp,
        shadow_map,
        np.empty((SHADOW_SIZE, SHADOW_SIZE), dtype=np.int32),
        np.zeros((scene.triangle_count, 10), dtype=np.float64),
        np.empty(SHADOW_SIZE, dtype=np.int32),
        np.empty(SHADOW_SIZE, dtype=np.int32),
    )
    shadow_map[:SHADOW_BORDER] = shadow_map[-SHADOW_BORDER:] = EMPTY_DEPTH
    shadow_map[:, :SHADOW_BORDER] = shadow_map[:, -SHADOW_BORDER:] = EMPTY_DEPTH

    # World → (u, v in texels, depth as the visibility pass stores it, 1 − z, plus a bias)
    depth_bias = 0.3 * texel * float(np.linalg.norm(light_vp[2, :3]))
    to_map = (np.diag([0.5 * SHADOW_SIZE, -0.5 * SHADOW_SIZE, -1.0, 1.0]) @ light_vp)[:3]
    to_map[:, 3] += (0.5 * SHADOW_SIZE, 0.5 * SHADOW_SIZE, 1.0 + depth_bias)

    triangles = np.zeros((scene.triangle_count, _TRIANGLE_WIDTH), dtype=np.float32)
    normals = scene.normals.astype(np.float64)
    triangles[:, 0:9] = normals.reshape(-1, 9)
    # Normal-offset shadow lookups: move each corner off its surface, more where the light
    # grazes it (where acne starts), and toward the lit side of double-sided surfaces.
    world = scene.positions.astype(np.float64) + _normal_offset(
        normals, to_light, texel, double[scene.material_ids][:, None]
    )
    uvd = np.c_[world.reshape(-1, 3), np.ones(world.shape[0] * 3)] @ to_map.T
    triangles[:, 9:18] = uvd.reshape(-1, 9)
    up = np.array([0.0, 1.0, 0.0])
    floor_offset = float(_normal_offset(up, to_light, texel, False)[1])

    return _Prepared(
        positions=scene.positions,
        cull_back=cull_back,
        material_ids=scene.material_ids,
        triangles=triangles,
        materials=materials,
        light=_light_params(to_light, scene.light_color, scene.daylight),
        shadow_matrix=to_map,
        shadow_tiles=_tile(shadow_map),
        shadow_coarse=_coarse(shadow_map),
        floor=(float(scene.bounds_min[1]), floor_offset),
        lut=_tone_lut(),
    )


def _normal_offset(
    normals: np.ndarray, to_light: np.ndarray, texel: float, double_sided: np.ndarray | bool
) -> np.ndarray:
    """How far to move surface points along their normals before a shadow-map lookup."""
    cos_l = normals @ to_light
    toward = np.where(double_sided & (cos_l < 0), -1.0, 1.0)
    sin_l = np.sqrt(np.clip(1.0 - cos_l**2, 0.0, 1.0))
    result: np.ndarray = (texel * (0.6 + 1.6 * sin_l) * toward)[..., None] * normals
    return result


def _light_projection(scene: Scene, to_light: np.ndarray) -> tuple[np.ndarray, float]:
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


def _tile(shadow_map: np.ndarray) -> np.ndarray:
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


def _coarse(shadow_map: np.ndarray) -> np.ndarray:
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
    return inner.max(axis=(1, 3)).reshape(-1).astype(np.float32)


def _light_params(
    to_light: np.ndarray, color: tuple[float, float, float], daylight: float = 1.0
) -> np.ndarray:
    """The shading kernel's light: toward the sun, sun colour, environment (float32 (15,)).

    The environment is the horizon colour and the differences zenith − horizon and
    floor − horizon, where the floor is what glossy surfaces see below the horizon. The sky
    dims with `daylight` and its horizon warms at dusk (halfway through the fade).
    """
    dim = _sky_scale(daylight)
    dusk = 4.0 * daylight * (1.0 - daylight)  # 0 by day and by night, 1 halfway
    irradiance = np.asarray(color) * max(float(to_light[1]), 0.0) + dim * np.asarray(AMBIENT_SKY)
    floor = np.asarray(FLOOR.base_color) * irradiance
    horizon = dim * ((1.0 - 0.6 * dusk) * np.asarray(SKY_HORIZON) + 0.6 * dusk * np.asarray(SUNSET))
    zenith = dim * np.asarray(SKY_ZENITH)
    return np.concatenate([to_light, color, horizon, zenith - horizon, floor - horizon]).astype(
        np.float32
    )


def _tone_lut() -> np.ndarray:
    """Linear radiance (indexed by its square root) → ACES-fit tone mapped sRGB byte."""
    x = (np.arange(LUT_SIZE) / (LUT_SIZE - 1)) ** 2 * LUT_MAX * EXPOSURE
    mapped = np.clip((x * (2.51 * x + 0.03)) / (x * (2.43 * x + 0.59) + 0.14), 0.0, 1.0)
    srgb = np.where(mapped <= 0.0031308, 12.92 * mapped, 1.055 * mapped ** (1 / 2.4) - 0.055)
    return np.round(srgb * 255.0).astype(np.uint8)


def _view(camera: OrbitCamera, width: int, height: int, floor: tuple[float, float]) -> np.ndarray:
    """The shading kernel's view constants: ray terms, eye, floor (float64 (14,)).

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


# -- kernels ------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, error_model="numpy")
def _visibility(positions, cull_back, vp, depth, ids, planes, row_lo, row_hi):  # type: ignore[no-untyped-def]
    """Visibility pass: nearest triangle id per pixel (−1: none) and its barycentric planes.

    For each drawn triangle t, planes[t] holds three screen-space planes e_k(i, j) whose
    normalized values e_k / Σe are the perspective-correct barycentrics at pixel (i, j).
    row_lo/row_hi bound the columns each row may have drawn (row_lo > row_hi: nothing).
    """
    height, width = depth.shape
    depth[:, :] = EMPTY_DEPTH
    ids[:, :] = -1
    row_lo[:] = width
    row_hi[:] = -1
    # pixel (i, j) centre → NDC: x = ax·i + bx, y = ay·j + by
    ax, bx = 2.0 / width, 1.0 / width - 1.0
    ay, by = -2.0 / height, 1.0 - 1.0 / height
    clip = np.empty((3, 4))
    poly = np.empty((2, 16, 4))
    drawn = 0
    for t in range(positions.shape[0]):
        for c in range(3):
            px, py, pz = positions[t, c, 0], positions[t, c, 1], positions[t, c, 2]
            for r in range(4):
                clip[c, r] = vp[r, 0] * px + vp[r, 1] * py + vp[r, 2] * pz + vp[r, 3]
        outside_all = 31
        need_clip = False
        for c in range(3):
            x, y, z, w = clip[c, 0], clip[c, 1], clip[c, 2], clip[c, 3]
            code = 0
            if x < -w:
                code |= 1
            if x > w:
                code |= 2
            if y < -w:
                code |= 4
            if y > w:
                code |= 8
            if z < -w:
                code |= 16
                need_clip = True
            if abs(x) > GUARD_BAND * w or abs(y) > GUARD_BAND * w:
                need_clip = True
            outside_all &= code
        if outside_all != 0:
            continue  # wholly outside one frustum plane

        # M = columns (x, y, w) of the corners; M⁻¹ maps (ndc x, ndc y, 1) to barycentrics / w.
        x0, y0, w0 = clip[0, 0], clip[0, 1], clip[0, 3]
        x1, y1, w1 = clip[1, 0], clip[1, 1], clip[1, 3]
        x2, y2, w2 = clip[2, 0], clip[2, 1], clip[2, 3]
        c00, c01, c02 = y1 * w2 - y2 * w1, y2 * w0 - y0 * w2, y0 * w1 - y1 * w0
        det = x0 * c00 + x1 * c01 + x2 * c02
        if det == 0.0 or (cull_back[t] != 0 and det < 0.0):
            continue  # edge-on, or facing away (det > 0: counter-clockwise on screen)
        inv = 1.0 / det
        # rows of M⁻¹ (the adjugate's rows over det), folded with the pixel → NDC map
        r00, r01, r02 = c00 * inv, (x2 * w1 - x1 * w2) * inv, (x1 * y2 - x2 * y1) * inv
        r10, r11, r12 = c01 * inv, (x0 * w2 - x2 * w0) * inv, (x2 * y0 - x0 * y2) * inv
        r20, r21, r22 = c02 * inv, (x1 * w0 - x0 * w1) * inv, (x0 * y1 - x1 * y0) * inv
        planes[t, 0], planes[t, 1], planes[t, 2] = r00 * ax, r01 * ay, r00 * bx + r01 * by + r02
        planes[t, 3], planes[t, 4], planes[t, 5] = r10 * ax, r11 * ay, r10 * bx + r11 * by + r12
        planes[t, 6], planes[t, 7], planes[t, 8] = r20 * ax, r21 * ay, r20 * bx + r21 * by + r22
        planes[t, 9] = 1.0 if det > 0.0 else -1.0
        # depth (w − z) / w = 1 − z_ndc, larger is nearer: Σ_k (w_k − z_k) · e_k
        q0, q1, q2 = w0 - clip[0, 2], w1 - clip[1, 2], w2 - clip[2, 2]
        d_i = q0 * planes[t, 0] + q1 * planes[t, 3] + q2 * planes[t, 6]
        d_j = q0 * planes[t, 1] + q1 * planes[t, 4] + q2 * planes[t, 7]
        d_c = q0 * planes[t, 2] + q1 * planes[t, 5] + q2 * planes[t, 8]

        if not need_clip:
            _fill(
                _fixed_x(x0 / w0, width), _fixed_y(y0 / w0, height),
                _fixed_x(x1 / w1, width), _fixed_y(y1 / w1, height),
                _fixed_x(x2 / w2, width), _fixed_y(y2 / w2, height),
                d_i, d_j, d_c, t, depth, ids, row_lo, row_hi,
            )  # fmt: skip
            drawn += 1
            continue

        n = 3
        for c in range(3):
            for r in range(4):
                poly[0, c, r] = clip[c, r]
        src = 0
        # near plane (z + w >= 0) first: after it every w is positive and the guard band tests
        # below mean what they say
        n = _clip_polygon(poly, src, n, 0.0, 0.0, 1.0, 1.0)
        src = 1 - src
        for plane in range(4):
            sx = -1.0 if plane == 0 else (1.0 if plane == 1 else 0.0)
            sy = -1.0 if plane == 2 else (1.0 if plane == 3 else 0.0)
            violated = False
            for c in range(n):
                if sx * poly[src, c, 0] + sy * poly[src, c, 1] + GUARD_BAND * poly[src, c, 3] < 0:
                    violated = True
            if violated:
                n = _clip_polygon(poly, src, n, sx, sy, 0.0, GUARD_BAND)
                src = 1 - src
        if n < 3:
            continue
        fx0 = _fixed_x(poly[src, 0, 0] / poly[src, 0, 3], width)
        fy0 = _fixed_y(poly[src, 0, 1] / poly[src, 0, 3], height)
        for c in range(1, n - 1):
            _fill(
                fx0, fy0,
                _fixed_x(poly[src, c, 0] / poly[src, c, 3], width),
                _fixed_y(poly[src, c, 1] / poly[src, c, 3], height),
                _fixed_x(poly[src, c + 1, 0] / poly[src, c + 1, 3], width),
                _fixed_y(poly[src, c + 1, 1] / poly[src, c + 1, 3], height),
                d_i, d_j, d_c, t, depth, ids, row_lo, row_hi,
            )  # fmt: skip
        drawn += 1
    return drawn


@njit(cache=True, nogil=True, inline="always")
def _fixed_x(ndc_x, width):  # type: ignore[no-untyped-def]
    return np.int64(math.floor((ndc_x * 0.5 + 0.5) * width * SUBPIXEL + 0.5))


@njit(cache=True, nogil=True, inline="always")
def _fixed_y(ndc_y, height):  # type: ignore[no-untyped-def]
    return np.int64(math.floor((0.5 - ndc_y * 0.5) * height * SUBPIXEL + 0.5))


@njit(cache=True, nogil=True, inline="always")
def _clip_polygon(poly, src, n, a, b, c, d):  # type: ignore[no-untyped-def]
    """Sutherland–Hodgman: keep the part of poly[src] where a·x + b·y + c·z + d·w >= 0."""
    dst = 1 - src
    m = 0
    for k in range(n):
        k2 = k + 1 if k + 1 < n else 0
        da = a * poly[src, k, 0] + b * poly[src, k, 1] + c * poly[src, k, 2] + d * poly[src, k, 3]
        db = a * poly[src, k2, 0] + b * poly[src, k2, 1] + c * poly[src, k2, 2]
        db += d * poly[src, k2, 3]
        if da >= 0.0:
            for r in range(4):
                poly[dst, m, r] = poly[src, k, r]
            m += 1
        if (da >= 0.0) != (db >= 0.0):
            s = da / (da - db)
            for r in range(4):
                poly[dst, m, r] = poly[src, k, r] + s * (poly[src, k2, r] - poly[src, k, r])
            m += 1
    return m


@njit(cache=True, nogil=True, fastmath=True)
def _fill(x0, y0, x1, y1, x2, y2, d_i, d_j, d_c, tid, depth, ids, row_lo, row_hi):  # type: ignore[no-untyped-def]
    """Depth-test and write the pixels whose centres a fixed-point triangle covers.

    Top-left fill rule: a pixel centre on an edge belongs to the triangle only if the edge is a
    top or a left edge, so triangles sharing an edge cover its pixels exactly once.
    """
    height, width = depth.shape
    area = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0)
    if area == 0:
        return
    if area < 0:  # make the corners run clockwise on the y-down screen, edges ≥ 0 inside
        x1, y1, x2, y2 = x2, y2, x1, y1
    half = SUBPIXEL // 2
    i_lo = max((min(x0, x1, x2) - half + SUBPIXEL - 1) // SUBPIXEL, 0)
    i_hi = min((max(x0, x1, x2) - half) // SUBPIXEL, width - 1)
    j_lo = max((min(y0, y1, y2) - half + SUBPIXEL - 1) // SUBPIXEL, 0)
    j_hi = min((max(y0, y1, y2) - half) // SUBPIXEL, height - 1)
    if i_lo > i_hi or j_lo > j_hi:
        return
    px = i_lo * SUBPIXEL + half
    py = j_lo * SUBPIXEL + half
    # edge k runs from corner a to corner b; value at the first pixel, steps per pixel
    f0, a0, b0 = _edge(x1, y1, x2, y2, px, py)
    f1, a1, b1 = _edge(x2, y2, x0, y0, px, py)
    f2, a2, b2 = _edge(x0, y0, x1, y1, px, py)
    tid32 = np.int32(tid)
    narrow = i_hi - i_lo < SPAN_MIN_WIDTH
    for j in range(j_lo, j_hi + 1):
        d_row = d_j * j + d_c
        if narrow:
            e0, e1, e2 = f0, f1, f2
            lo, hi = width, -1
            for i in range(i_lo, i_hi + 1):
                if (e0 | e1 | e2) >= 0:
                    z = np.float32(d_i * i + d_row)
                    if z > depth[j, i]:
                        depth[j, i] = z
                        ids[j, i] = tid
                    lo = min(lo, i)
                    hi = i
                e0 += a0
                e1 += a1
                e2 += a2
        else:
            # exact span: the columns where every edge value f + a·(i − i_lo) is ≥ 0
            lo, hi = i_lo, i_hi
            lo, hi = _span(f0, a0, i_lo, lo, hi)
            lo, hi = _span(f1, a1, i_lo, lo, hi)
            lo, hi = _span(f2, a2, i_lo, lo, hi)
            # branch-free and in 32-bit lanes, so that it vectorizes
            z0 = np.float32(d_i * lo + d_row)
            dz = np.float32(d_i)
            fn = np.float32(0.0)
            ju = np.uint64(j)
            for i in range(np.uint64(max(lo, 0)), np.uint64(hi + 1)):
                z = z0 + dz * fn
                old = depth[ju, i]
                closer = z > old
                depth[ju, i] = z if closer else old
                ids[ju, i] = tid32 if closer else ids[ju, i]
                fn += np.float32(1.0)
        if lo <= hi:
            row_lo[j] = min(row_lo[j], lo)
            row_hi[j] = max(row_hi[j], hi)
        f0 += b0
        f1 += b1
        f2 += b2


@njit(cache=True, nogil=True, inline="always")
def _edge(ax, ay, bx, by, px, py):  # type: ignore[no-untyped-def]
    """Edge a→b at point p, biased by −1 unless top-left, with its steps along i and j."""
    dx = bx - ax
    dy = by - ay
    value = dx * (py - ay) - dy * (px - ax)
    top_left = dy < 0 or (dy == 0 and dx > 0)
    if not top_left:
        value -= 1  # strict: a centre exactly on this edge is left to the neighbour
    return value, -dy * SUBPIXEL, dx * SUBPIXEL


@njit(cache=True, nogil=True, inline="always")
def _span(f, a, i0, lo, hi):  # type: ignore[no-untyped-def]
    """Narrow [lo, hi] to the columns i where f + a·(i − i0) >= 0."""
    if a > 0:
        if f < 0:
            lo = max(lo, i0 + (-f + a - 1) // a)
    elif a < 0:
        if f < 0:
            hi = -1
            lo = 0
        else:
            hi = min(hi, i0 + f // (-a))
    elif f < 0:
        hi = -1
        lo = 0
    return lo, hi


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def _shade(ids, planes, triangles, material_ids, materials, view, light, shadow_matrix, shadow_tiles, shadow_coarse, lut, row_lo, row_hi, out, row_start, row_stop):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """Shading pass: light every pixel once from its triangle; floor or sky where there is none.

    A row is cut into runs of one triangle (or of floor). Along a run every interpolated
    quantity times 1/w is affine in the column, so a run costs one setup, the shadow-map
    lookups, and a lighting loop that LLVM vectorizes.
    """
    height, width = ids.shape
    f0 = np.float32(0.0)
    f1 = np.float32(1.0)
    top = np.int32(LUT_SIZE - 1)
    zero = np.int32(0)
    scale = np.float32((LUT_SIZE - 1) / math.sqrt(LUT_MAX))
    # LANES of slack: loops run over whole vectors past the end of a run (the next run
    # overwrites the excess), so no pixel falls to a slow scalar remainder loop
    lit = np.zeros(width + LANES, dtype=np.float32)
    out_r = np.zeros(width + LANES, dtype=np.int32)
    out_g = np.zeros(width + LANES, dtype=np.int32)
    out_b = np.zeros(width + LANES, dtype=np.int32)
    tap = np.zeros(width + LANES, dtype=np.int32)
    tap_u = np.zeros(width + LANES, dtype=np.float32)
    tap_v = np.zeros(width + LANES, dtype=np.float32)
    tap_d = np.zeros(width + LANES, dtype=np.float32)
    tap_c = np.zeros(width + LANES, dtype=np.int32)
    lx, ly, lz = light[0], light[1], light[2]
    sun_r, sun_g, sun_b = light[3], light[4], light[5]
    hor_r, hor_g, hor_b = light[6], light[7], light[8]
    zen_r, zen_g, zen_b = light[9], light[10], light[11]  # minus the horizon
    flo_r, flo_g, flo_b = light[12], light[13], light[14]  # minus the horizon
    rxs, rys, rzs = np.float32(view[3]), np.float32(view[4]), np.float32(view[5])
    eye_x, eye_y, eye_z = view[9], view[10], view[11]
    floor_y, floor_offset = view[12], view[13]
    floor_m = materials.shape[0] - 1
    for jj in range(row_start, row_stop):
        j = np.uint64(jj)
        # the camera never rolls, so a ray's height depends on its row alone
        ray_x = view[0] + jj * view[6] + 0.5 * width * view[3]
        ray_y = view[1] + jj * view[7]
        ray_z = view[2] + jj * view[8] + 0.5 * width * view[5]
        length = math.sqrt(ray_x * ray_x + ray_y * ray_y + ray_z * ray_z)
        above = math.sqrt(max(ray_y, 0.0) / length)
        sky_r = _lut_index(hor_r + zen_r * above, scale, top)
        sky_g = _lut_index(hor_g + zen_g * above, scale, top)
        sky_b = _lut_index(hor_b + zen_b * above, scale, top)
        floor_row = ray_y < 0.0 and eye_y > floor_y
        lo = max(row_lo[jj], 0)
        hi = min(row_hi[jj], width - 1)
        if floor_row:
            lo, hi = 0, width - 1
        elif lo > hi:
            lo, hi = width, width - 1
        for k in range(np.uint64(0), np.uint64(lo)):
            out[j, k, 0] = lut[sky_r]
            out[j, k, 1] = lut[sky_g]
            out[j, k, 2] = lut[sky_b]
        for k in range(np.uint64(hi + 1), np.uint64(width)):
            out[j, k, 0] = lut[sky_r]
            out[j, k, 1] = lut[sky_g]
            out[j, k, 2] = lut[sky_b]
        i = lo
        while i <= hi:
            t = ids[j, np.uint64(i)]
            end = i + 1
            while end <= hi and ids[j, np.uint64(end)] == t:
                end += 1
            base = np.uint64(i)
            count = np.uint64(end - i)
            if t < 0 and not floor_row:
                for n in range(count):
                    out_r[base + n] = sky_r
                    out_g[base + n] = sky_g
                    out_b[base + n] = sky_b
                i = end
                continue
            if t < 0:
                # the floor: facing up; the point under column i + n is p + n·dp, moved up by
                # the normal offset for its shadow lookup
                m = floor_m
                nxs, nys, nzs = f0, f0, f0
                nx0, ny0, nz0 = f0, f1, f0
                hit = (floor_y - eye_y) / ray_y
                px = eye_x + hit * (view[0] + i * view[3] + jj * view[6])
                py = floor_y + floor_offset
                pz = eye_z + hit * (view[2] + i * view[5] + jj * view[8])
                dpx, dpz = hit * view[3], hit * view[5]
                s = shadow_matrix
                us = np.float32(s[0, 0] * dpx + s[0, 2] * dpz)
                u0 = np.float32(s[0, 0] * px + s[0, 1] * py + s[0, 2] * pz + s[0, 3])
                vs = np.float32(s[1, 0] * dpx + s[1, 2] * dpz)
                v0 = np.float32(s[1, 0] * px + s[1, 1] * py + s[1, 2] * pz + s[1, 3])
                ds = np.float32(s[2, 0] * dpx + s[2, 2] * dpz)
                d0 = np.float32(s[2, 0] * px + s[2, 1] * py + s[2, 2] * pz + s[2, 3])
                es, e0 = f0, f1
            else:
                m = material_ids[t]
                nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0 = _triangle_terms(
                    t, i, jj, planes, triangles
                )
            _sun_visibility(
                base, count, nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0,
                lx, ly, lz, shadow_tiles, shadow_coarse, lit, tap, tap_u, tap_v, tap_d, tap_c,
            )  # fmt: skip

            sd_r, sd_g, sd_b = materials[m, 0], materials[m, 1], materials[m, 2]
            sf_r, sf_g, sf_b = materials[m, 3], materials[m, 4], materials[m, 5]
            ad_r, ad_g, ad_b = materials[m, 6], materials[m, 7], materials[m, 8]
            au_r, au_g, au_b = materials[m, 9], materials[m, 10], materials[m, 11]
            fe_r, fe_g, fe_b = materials[m, 12], materials[m, 13], materials[m, 14]
            fg_r, fg_g, fg_b = materials[m, 15], materials[m, 16], materials[m, 17]
            alpha2, rough, sharp = materials[m, 18], materials[m, 19], materials[m, 20]
            vx0 = np.float32(view[0] + i * view[3] + jj * view[6])
            vy0 = np.float32(ray_y)
            vz0 = np.float32(view[2] + i * view[5] + jj * view[8])
            # the lighting, branch-free and in whole vectors; fn is a float induction variable
            # because an int64 one would need 512-bit vectors
            padded = (count + np.uint64(LANES - 1)) & ~np.uint64(LANES - 1)
            fn = f0
            for n in range(padded):
                nx = nxs * fn + nx0
                ny = nys * fn + ny0
                nz = nzs * fn + nz0
                rx = vx0 + fn * rxs  # the view ray, from the eye
                ry = vy0 + fn * rys
                rz = vz0 + fn * rzs
                inv_n = f1 / math.sqrt(nx * nx + ny * ny + nz * nz + np.float32(1e-30))
                inv_r = f1 / math.sqrt(rx * rx + ry * ry + rz * rz)
                n_dot_l = (nx * lx + ny * ly + nz * lz) * inv_n
                n_dot_r = (nx * rx + ny * ry + nz * rz) * (inv_n * inv_r)
                r_dot_l = (rx * lx + ry * ly + rz * lz) * inv_r
                # half vector h = l + v with v = −ray: |h|² = 2 − 2 r·l, no vector needed
                h2 = max(np.float32(2.0) - np.float32(2.0) * r_dot_l, np.float32(1e-6))
                inv_h = f1 / math.sqrt(h2)
                n_dot_h = max((n_dot_l - n_dot_r) * inv_h, f0)
                v_dot_h = max((f1 - r_dot_l) * inv_h, f0)
                n_dot_v = max(-n_dot_r, np.float32(1e-3))
                ny = ny * inv_n
                # sun: Lambert + GGX distribution with Kelemen visibility (π folded into the sun)
                den = n_dot_h * n_dot_h * (alpha2 - f1) + f1
                vis = np.float32(0.25) / max(v_dot_h * v_dot_h, np.float32(0.1))
                spec = alpha2 * vis / (den * den)
                f5 = f1 - v_dot_h
                f5 = f5 * f5 * f5 * f5 * f5
                e = max(n_dot_l, f0) * lit[base + n]
                # ambient: a sky/ground hemisphere for diffuse; for specular the environment
                # along the reflection (bent to the normal with roughness), roughness-aware Fresnel
                up = np.float32(0.5) + np.float32(0.5) * ny
                refl_y = np.float32(2.0) * n_dot_v * ny + ry * inv_r
                ey = refl_y + (ny - refl_y) * rough
                env_up = math.sqrt(min(max(ey, f0), f1))
                env_dn = min(max(-ey * sharp, f0), f1)
                g5 = f1 - n_dot_v
                g5 = g5 * g5 * g5 * g5 * g5
                cr = e * (sd_r + spec * (sf_r + (sun_r - sf_r) * f5)) + ad_r + au_r * up
                cg = e * (sd_g + spec * (sf_g + (sun_g - sf_g) * f5)) + ad_g + au_g * up
                cb = e * (sd_b + spec * (sf_b + (sun_b - sf_b) * f5)) + ad_b + au_b * up
                cr += (fe_r + fg_r * g5) * (hor_r + zen_r * env_up + flo_r * env_dn)
                cg += (fe_g + fg_g * g5) * (hor_g + zen_g * env_up + flo_g * env_dn)
                cb += (fe_b + fg_b * g5) * (hor_b + zen_b * env_up + flo_b * env_dn)
                out_r[base + n] = min(max(np.int32(math.sqrt(max(cr, f0)) * scale), zero), top)
                out_g[base + n] = min(max(np.int32(math.sqrt(max(cg, f0)) * scale), zero), top)
                out_b[base + n] = min(max(np.int32(math.sqrt(max(cb, f0)) * scale), zero), top)
                fn += f1
            i = end
        for k in range(np.uint64(lo), np.uint64(hi + 1)):
            out[j, k, 0] = lut[np.uint64(out_r[k])]
            out[j, k, 1] = lut[np.uint64(out_g[k])]
            out[j, k, 2] = lut[np.uint64(out_b[k])]


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy", inline="always")
def _triangle_terms(t, i, jj, planes, triangles):  # type: ignore[no-untyped-def]
    """Affine terms along row jj from column i of triangle t's normal and shadow coordinates.

    Each quantity q times 1/w is qs·n + q0 at column i + n; so is 1/w itself (es, e0).
    """
    # e_k = a_k·n + c_k are the barycentrics times 1/w along this run
    a0, c0 = planes[t, 0], planes[t, 0] * i + planes[t, 1] * jj + planes[t, 2]
    a1, c1 = planes[t, 3], planes[t, 3] * i + planes[t, 4] * jj + planes[t, 5]
    a2, c2 = planes[t, 6], planes[t, 6] * i + planes[t, 7] * jj + planes[t, 8]
    facing = planes[t, 9]  # −1 on the back of a double-sided surface: flip the normal
    q0, q1, q2 = triangles[t, 0], triangles[t, 3], triangles[t, 6]
    nxs = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    nx0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 1], triangles[t, 4], triangles[t, 7]
    nys = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    ny0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 2], triangles[t, 5], triangles[t, 8]
    nzs = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    nz0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 9], triangles[t, 12], triangles[t, 15]
    us, u0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    q0, q1, q2 = triangles[t, 10], triangles[t, 13], triangles[t, 16]
    vs, v0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    q0, q1, q2 = triangles[t, 11], triangles[t, 14], triangles[t, 17]
    ds, d0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    es, e0 = np.float32(a0 + a1 + a2), np.float32(c0 + c1 + c2)
    return nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy", inline="always")
def _sun_visibility(base, count, nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0, lx, ly, lz, shadow_tiles, shadow_coarse, lit, tap, tap_u, tap_v, tap_d, tap_c):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """lit[base + n] for n < count: the 2×2 bilinear PCF of the shadow map (0 in shadow).

    Texel addresses and weights are computed for whole vectors first (this vectorizes), then
    the lookups go one by one, since gathers are what LLVM will not emit here.
    """
    f0 = np.float32(0.0)
    f1 = np.float32(1.0)
    tile = np.float32(TILE)
    step = np.float32(TILE_STEP)
    inv_step = np.float32(1.0 / TILE_STEP)
    tiles = np.float32((SHADOW_SIZE - 2) // TILE_STEP + 1)  # per side
    texel_max = np.float32(SHADOW_SIZE - 2)  # the 2×2 footprint starts at most here
    zero = np.int32(0)
    last_tap = np.int32(shadow_tiles.shape[0] - TILE - 2)
    last_block = np.int32(shadow_coarse.shape[0] - 1)
    blocks = np.float32(-(-SHADOW_SIZE // COARSE))
    inv_coarse = np.float32(1.0 / COARSE)
    away = np.float32(-3.0e38)  # a depth every occluder beats: no light
    padded = (count + np.uint64(LANES - 1)) & ~np.uint64(LANES - 1)
    fn = f0
    for n in range(padded):
        inv = f1 / (es * fn + e0)
        su = (us * fn + u0) * inv - np.float32(0.5)
        sv = (vs * fn + v0) * inv - np.float32(0.5)
        fu = np.floor(su)
        fv = np.floor(sv)
        # texel and tile arithmetic in float32: exact below 2**24, and 32-bit lanes
        iu = min(max(fu, f0), texel_max)
        iv = min(max(fv, f0), texel_max)
        tu = np.floor((iu + np.float32(0.5)) * inv_step)
        tv = np.floor((iv + np.float32(0.5)) * inv_step)
        index = ((tv * tiles + tu) * tile + iv - tv * step) * tile + iu - tu * step
        # clamped as integers too: a degenerate triangle's NaN must not become an address
        tap[base + n] = min(max(np.int32(index), zero), last_tap)
        coarse = np.int32(np.floor(iv * inv_coarse) * blocks + np.floor(iu * inv_coarse))
        tap_c[base + n] = min(max(coarse, zero), last_block)
        tap_u[base + n] = su - fu
        tap_v[base + n] = sv - fv
        toward_sun = (nxs * fn + nx0) * lx + (nys * fn + ny0) * ly + (nzs * fn + nz0) * lz
        tap_d[base + n] = (ds * fn + d0) * inv if toward_sun > f0 else away
        fn += f1
    for n in range(count):
        k = base + n
        d = tap_d[k]
        if d == away:
            lit[k] = f0
            continue
        if d >= shadow_coarse[np.uint64(tap_c[k])]:
            lit[k] = f1  # nearer the sun than anything in this block
            continue
        x = np.uint64(tap[k])
        l00 = f1 if d >= shadow_tiles[x] else f0
        l10 = f1 if d >= shadow_tiles[x + np.uint64(1)] else f0
        l01 = f1 if d >= shadow_tiles[x + np.uint64(TILE)] else f0
        l11 = f1 if d >= shadow_tiles[x + np.uint64(TILE + 1)] else f0
        top_row = l00 + (l10 - l00) * tap_u[k]
        lit[k] = top_row + (l01 + (l11 - l01) * tap_u[k] - top_row) * tap_v[k]


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _lut_index(x, scale, top):  # type: ignore[no-untyped-def]
    """Index of linear radiance x in the tone-mapping table (indexed by the square root)."""
    return np.int32(min(max(np.int64(math.sqrt(max(x, 0.0)) * scale), 0), top))
