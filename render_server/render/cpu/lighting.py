"""The light the shading pass applies, as tables: per-material terms, the sun and the sky, and
the tone curve from linear radiance to sRGB bytes.

The sun and the ambient light are folded into each material's row here, once per scene, so
that the per-pixel loop multiplies and adds only.
"""

from __future__ import annotations

import numpy as np

from render_server.render.cpu.shading import LUT_MAX, LUT_SIZE
from render_server.render.scene import FLOOR_MATERIAL, Scene, linear_to_srgb

EXPOSURE = 0.6

# Lighting constants, linear RGB. The sky gradient is also what glossy surfaces reflect.
SKY_ZENITH = (0.2, 0.38, 0.78)
SKY_HORIZON = (0.78, 0.84, 0.92)
AMBIENT_SKY = (0.3, 0.36, 0.45)
AMBIENT_GROUND = (0.12, 0.11, 0.1)
NIGHT_SKY = 0.04  # what is left of the sky's brightness at night (Scene.daylight 0)
SUNSET = (0.95, 0.5, 0.3)  # the horizon's tint at dusk

# Per-material row of the shading table, with the sun and ambient light folded in: sun ×
# diffuse, sun × F0, the hemisphere ambient a + b·up (a, b), the environment's Fresnel
# F0 + g·(1 − n·v)⁵ (F0, g), GGX alpha², roughness, and how sharp the reflected horizon is.
MATERIAL_WIDTH = 21


def sky_scale(daylight: float) -> float:
    """How bright the sky and its ambient light are at `daylight` (1 day … 0 night)."""
    return NIGHT_SKY + (1.0 - NIGHT_SKY) * min(max(daylight, 0.0), 1.0)


def material_table(scene: Scene) -> np.ndarray:
    """The shading rows of the scene's materials, then the endless floor's: float32 (M + 1, 21)."""
    sun = np.asarray(scene.light_color, dtype=np.float64)
    dim = sky_scale(scene.daylight)
    sky, ground = dim * np.asarray(AMBIENT_SKY), dim * np.asarray(AMBIENT_GROUND)
    materials = np.zeros((len(scene.materials) + 1, MATERIAL_WIDTH), dtype=np.float32)
    for i, m in enumerate([*scene.materials, FLOOR_MATERIAL]):
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
    return materials


def light_params(
    to_light: np.ndarray, color: tuple[float, float, float], daylight: float = 1.0
) -> np.ndarray:
    """The shading kernel's light: toward the sun, sun colour, environment (float32 (15,)).

    The environment is the horizon colour and the differences zenith − horizon and
    floor − horizon, where the floor is what glossy surfaces see below the horizon. The sky
    dims with `daylight` and its horizon warms at dusk (halfway through the fade).
    """
    dim = sky_scale(daylight)
    dusk = 4.0 * daylight * (1.0 - daylight)  # 0 by day and by night, 1 halfway
    irradiance = np.asarray(color) * max(float(to_light[1]), 0.0) + dim * np.asarray(AMBIENT_SKY)
    floor = np.asarray(FLOOR_MATERIAL.base_color) * irradiance
    horizon = dim * ((1.0 - 0.6 * dusk) * np.asarray(SKY_HORIZON) + 0.6 * dusk * np.asarray(SUNSET))
    zenith = dim * np.asarray(SKY_ZENITH)
    return np.concatenate([to_light, color, horizon, zenith - horizon, floor - horizon]).astype(
        np.float32
    )


def tone_lut() -> np.ndarray:
    """Linear radiance (indexed by its square root) → ACES-fit tone mapped sRGB byte."""
    x = (np.arange(LUT_SIZE) / (LUT_SIZE - 1)) ** 2 * LUT_MAX * EXPOSURE
    mapped = np.clip((x * (2.51 * x + 0.03)) / (x * (2.43 * x + 0.59) + 0.14), 0.0, 1.0)
    return np.round(linear_to_srgb(mapped) * 255.0).astype(np.uint8)
