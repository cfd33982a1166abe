"""The orbit camera every renderer draws from: a target, a distance and two angles."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Vec3 = tuple[float, float, float]

MAX_PITCH = math.radians(89.0)  # at ±90° the view direction is parallel to +Y and "right" is lost
DEFAULT_FOV_Y = math.radians(50.0)
NEAR_FRACTION = 0.02  # inside the scene, the near plane is this share of the orbit distance


@dataclass
class OrbitCamera:
    """A camera orbiting `target` at `distance`; +Y is up, angles are in radians.

    `yaw` turns the eye about +Y (0: the eye is on the +Z side of the target, looking down −Z);
    `pitch` is the eye's elevation above the target (positive: looking down on it). The scene
    fields (`scene_center`, `scene_radius`) and the distance limits come from `framed_on` and set
    the clip planes and the zoom range. The methods change the camera in place.
    """

    target: Vec3 = (0.0, 0.0, 0.0)
    distance: float = 5.0
    yaw: float = 0.0
    pitch: float = 0.0
    fov_y: float = DEFAULT_FOV_Y
    min_distance: float = 0.05
    max_distance: float = 1000.0
    scene_center: Vec3 = (0.0, 0.0, 0.0)
    scene_radius: float = 1.0

    def __post_init__(self) -> None:
        self.target = _vec3(self.target)
        self.scene_center = _vec3(self.scene_center)
        self.pitch = _clamp(float(self.pitch), -MAX_PITCH, MAX_PITCH)
        self.distance = _clamp(float(self.distance), self.min_distance, self.max_distance)

    @classmethod
    def framed_on(
        cls,
        bounds_min: Sequence[float] | np.ndarray,
        bounds_max: Sequence[float] | np.ndarray,
        fov_y: float = DEFAULT_FOV_Y,
        aspect: float = 16 / 9,
        yaw: float = math.radians(35.0),
        pitch: float = math.radians(22.0),
    ) -> OrbitCamera:
        """A 3/4 view from above, aimed at the box's centre, that shows all of the box.

        The box fits a view of `aspect` or wider. A pitch a little under half the field of
        view keeps a band of sky above the horizon.
        """
        lo = np.asarray(bounds_min, dtype=np.float64).reshape(3)
        hi = np.asarray(bounds_max, dtype=np.float64).reshape(3)
        center = (lo + hi) / 2
        radius = max(float(np.linalg.norm(hi - lo)) / 2, 1e-3)
        cam = cls(
            target=_vec3(center),
            distance=radius,
            yaw=yaw,
            pitch=pitch,
            fov_y=fov_y,
            min_distance=radius * 0.02,
            max_distance=radius * 20.0,
            scene_center=_vec3(center),
            scene_radius=radius,
        )
        right, up, back = cam._basis()
        tan_y = math.tan(fov_y / 2) * 0.92  # a small margin around the scene
        tan_x = tan_y * max(aspect, 1e-3)
        corners = np.array(np.meshgrid(*zip(lo, hi, strict=True))).T.reshape(-1, 3)
        # A corner at `rel` from the target lies at depth distance − rel·back and is in view
        # when |rel·up| <= tan_y·depth and |rel·right| <= tan_x·depth.
        rel = corners - center
        distance = float(
            np.max(np.maximum(np.abs(rel @ up) / tan_y, np.abs(rel @ right) / tan_x) + rel @ back)
        )
        cam.distance = _clamp(distance, cam.min_distance, cam.max_distance)
        return cam

    # -- steering -------------------------------------------------------------------------------

    def orbit(self, d_yaw: float, d_pitch: float) -> None:
        """Turn the eye about the target; the pitch stays within ±89°."""
        self.yaw = math.remainder(self.yaw + d_yaw, 2 * math.pi)
        self.pitch = _clamp(self.pitch + d_pitch, -MAX_PITCH, MAX_PITCH)

    def zoom(self, factor: float) -> None:
        """Multiply the distance by `factor`, within [min_distance, max_distance]."""
        if factor > 0 and math.isfinite(factor):
            self.distance = _clamp(self.distance * factor, self.min_distance, self.max_distance)

    def pan(self, dx: float, dy: float) -> None:
        """Move the target along the view's right and up axes by `dx`, `dy` view heights.

        One view height is the height of the view at the target's distance, so a caller passes
        pointer deltas divided by the viewport height (negated for "drag the scene" behaviour).
        """
        right, up, _ = self._basis()
        height = 2.0 * self.distance * math.tan(self.fov_y / 2)
        self.target = _vec3(np.asarray(self.target) + height * (dx * right + dy * up))

    def move(self, forward: float, right: float, up: float) -> None:
        """Move the target in world units: along the ground under the view, and along +Y."""
        s, c = math.sin(self.yaw), math.cos(self.yaw)
        ground_forward = np.array([-s, 0.0, -c])
        ground_right = np.array([c, 0.0, -s])
        delta = forward * ground_forward + right * ground_right + np.array([0.0, up, 0.0])
        self.target = _vec3(np.asarray(self.target) + delta)

    # -- matrices -------------------------------------------------------------------------------

    def eye(self) -> np.ndarray:
        """The eye position, float64 (3,)."""
        _, _, back = self._basis()
        return np.asarray(self.target, dtype=np.float64) + self.distance * back

    def view_matrix(self) -> np.ndarray:
        """World → camera (4, 4) float64: right-handed, +Y up, looking down −Z."""
        right, up, back = self._basis()
        eye = self.eye()
        m = np.eye(4)
        m[0, :3], m[1, :3], m[2, :3] = right, up, back
        m[:3, 3] = -m[:3, :3] @ eye
        return m

    def clip_planes(self) -> tuple[float, float]:
        """(near, far): far holds the whole scene sphere; near is as far out as is safe.

        Outside the scene sphere nothing is nearer than the sphere. Inside it, a near plane at
        a share of the far plane would cut off the ground under a low camera in a large scene,
        so it follows the orbit distance instead: what the user looks at is that far away.
        """
        to_center = float(np.linalg.norm(self.eye() - np.asarray(self.scene_center)))
        far = (to_center + self.scene_radius) * 1.01
        inside = min(NEAR_FRACTION * self.distance, NEAR_FRACTION * 0.1 * self.scene_radius)
        near = max(to_center - self.scene_radius, inside, far * 1e-7)
        return near, far

    def projection_matrix(self, aspect: float) -> np.ndarray:
        """Camera → OpenGL clip space (4, 4) float64 (depth −1 at near, +1 at far)."""
        near, far = self.clip_planes()
        f = 1.0 / math.tan(self.fov_y / 2)
        m = np.zeros((4, 4))
        m[0, 0] = f / aspect
        m[1, 1] = f
        m[2, 2] = (far + near) / (near - far)
        m[2, 3] = 2.0 * far * near / (near - far)
        m[3, 2] = -1.0
        return m

    def view_projection(self, aspect: float) -> np.ndarray:
        """World → clip space (4, 4) float64."""
        vp: np.ndarray = self.projection_matrix(aspect) @ self.view_matrix()  # both float64
        return vp

    # -- snapshots ------------------------------------------------------------------------------

    def copy(self) -> OrbitCamera:
        """An independent camera with the same state (every field is immutable, and already
        checked: a shallow copy, without `__post_init__`'s conversions, once per frame: the
        instance dict copied directly, a fifth of `copy.copy`'s reduce protocol)."""
        twin = object.__new__(type(self))
        twin.__dict__.update(self.__dict__)
        return twin

    def state(self) -> tuple[float, ...]:
        """A hashable snapshot of everything that decides the pixels."""
        return (
            *self.target,
            self.distance,
            self.yaw,
            self.pitch,
            self.fov_y,
            *self.scene_center,
            self.scene_radius,
        )

    def _basis(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Unit right, up and back (eye − target direction) vectors of the view."""
        sy, cy = math.sin(self.yaw), math.cos(self.yaw)
        sp, cp = math.sin(self.pitch), math.cos(self.pitch)
        back = np.array([cp * sy, sp, cp * cy])
        right = np.array([cy, 0.0, -sy])  # horizontal: the camera never rolls
        up = np.cross(back, right)
        return right, up, back


def _clamp(value: float, lo: float, hi: float) -> float:
    return min(max(value, lo), hi)


def _vec3(value: Sequence[float] | np.ndarray) -> Vec3:
    x, y, z = (float(v) for v in np.asarray(value, dtype=np.float64).reshape(3))
    return (x, y, z)
