"""The sun (or, at night, the moon) for a time of day: the one directional light of a scene.

A simple model, not an almanac: the sun rises at 6:00, culminates at 12:00 and sets at 18:00,
turning 15° of azimuth an hour. It is fitted so that 15:00 gives exactly the default scene's sun
(DEFAULT_LIGHT_DIRECTION and DEFAULT_LIGHT_COLOR), and a scene that was never given a time of
day is lit as at DEFAULT_HOUR. A lower sun is dimmer and warmer (blue fades first); at night a
faint bluish moon stands high opposite the sun, so a night picture is dark but never black.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from render_server.render.scene import DEFAULT_LIGHT_COLOR, DEFAULT_LIGHT_DIRECTION

DEFAULT_HOUR: Final = 15.0
HOURS_PER_DAY: Final = 24.0
MOON_COLOR: Final = (0.05, 0.065, 0.11)  # linear RGB
MOON_ELEVATION: Final = math.radians(40.0)
DUSK_LOW, DUSK_HIGH = -0.08, 0.25  # the sine of the sun's elevation where the sky fades
# per channel: how fast the sun's colour fades as its elevation's sine falls (blue fastest)
_FADE: Final = np.array([0.6, 1.0, 1.6])

_to_sun_default = -np.asarray(DEFAULT_LIGHT_DIRECTION, dtype=np.float64)
_to_sun_default /= np.linalg.norm(_to_sun_default)
_ELEVATION_DEFAULT: Final = math.asin(float(_to_sun_default[1]))
_AZIMUTH_DEFAULT: Final = math.atan2(float(_to_sun_default[2]), float(_to_sun_default[0]))
# the noon elevation that puts the sun at the default elevation at DEFAULT_HOUR
_NOON_ELEVATION: Final = _ELEVATION_DEFAULT / math.sin(math.pi * (DEFAULT_HOUR - 6.0) / 12.0)


def sun_elevation(hours: float) -> float:
    """The sun's elevation in radians (negative below the horizon)."""
    return _NOON_ELEVATION * math.sin(math.pi * (hours - 6.0) / 12.0)


def daylight_for_hour(hours: float) -> float:
    """How much of the day's sky is left (1 … 0): full while the sun stands over ~15°, fading
    through dusk to none once it is ~5° below the horizon."""
    x = (math.sin(sun_elevation(hours)) - DUSK_LOW) / (DUSK_HIGH - DUSK_LOW)
    x = min(max(x, 0.0), 1.0)
    return x * x * (3.0 - 2.0 * x)


def light_for_hour(hours: float) -> tuple[np.ndarray, tuple[float, float, float]]:
    """(direction the light travels, float32 (3,); linear RGB colour) at `hours` (0..24)."""
    if not (math.isfinite(hours) and 0.0 <= hours <= HOURS_PER_DAY):
        raise ValueError(f"hours {hours} is outside 0..24")
    azimuth = _AZIMUTH_DEFAULT + math.radians(15.0) * (hours - DEFAULT_HOUR)
    elevation = sun_elevation(hours)
    ratio = max(math.sin(elevation), 0.0) / math.sin(_ELEVATION_DEFAULT)
    sun = np.asarray(DEFAULT_LIGHT_COLOR) * ratio**_FADE
    if _luminance(sun) >= _luminance(np.asarray(MOON_COLOR)):
        to_light = _direction(elevation, azimuth)
        color = sun
    else:
        to_light = _direction(MOON_ELEVATION, azimuth + math.pi)
        color = np.asarray(MOON_COLOR)
    r, g, b = (float(c) for c in color)
    return (-to_light).astype(np.float32), (r, g, b)


def _direction(elevation: float, azimuth: float) -> np.ndarray:
    """The unit vector toward a body at `elevation` above the horizon, `azimuth` in x-z."""
    flat = math.cos(elevation)
    return np.array([flat * math.cos(azimuth), math.sin(elevation), flat * math.sin(azimuth)])


def _luminance(rgb: np.ndarray) -> float:
    return float(rgb @ np.array([0.2126, 0.7152, 0.0722]))
