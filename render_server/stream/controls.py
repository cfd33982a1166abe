"""Input events → orbit camera: drag orbits, wheel zooms, right/shift drag pans, keys move.

In pointer lock a move orbits without any button held (look around, as in a game); a gamepad's
left stick moves like WASD, its right stick orbits and its triggers move down and up.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np

from render_server.protocol.data_channel import (
    BlurEvent,
    CameraInput,
    GamepadEvent,
    KeyEvent,
    PointerEvent,
    TouchEvent,
    TouchPoint,
    WheelEvent,
)
from render_server.render.camera import OrbitCamera

ORBIT_PER_HEIGHT: Final = math.pi  # a drag across the whole view height turns 180°
ZOOM_PER_PIXEL: Final = 0.0015  # wheel: 100 px (one notch) zooms by about 16 %
MOVE_SPEED: Final = 0.8  # keys: target distances per second
ANIMATE_YAW_PER_S: Final = 0.35
GAMEPAD_DEAD_ZONE: Final = 0.15  # sticks rest a little off centre
GAMEPAD_ORBIT_PER_S: Final = 2.0  # radians a second at full deflection of the right stick
# standard mapping (https://w3c.github.io/gamepad/#remapping)
LEFT_X, LEFT_Y, RIGHT_X, RIGHT_Y = 0, 1, 2, 3
LEFT_TRIGGER, RIGHT_TRIGGER = 6, 7

# KeyboardEvent.code → (forward, right, up)
MOVE_KEYS: Final[dict[str, tuple[int, int, int]]] = {
    "KeyW": (1, 0, 0),
    "ArrowUp": (1, 0, 0),
    "KeyS": (-1, 0, 0),
    "ArrowDown": (-1, 0, 0),
    "KeyA": (0, -1, 0),
    "ArrowLeft": (0, -1, 0),
    "KeyD": (0, 1, 0),
    "ArrowRight": (0, 1, 0),
    "KeyE": (0, 0, 1),
    "PageUp": (0, 0, 1),
    "KeyQ": (0, 0, -1),
    "PageDown": (0, 0, -1),
}


class CameraController:
    """Owns the session's camera; events arrive on the event loop, frames take snapshots."""

    def __init__(self, camera: OrbitCamera, animate: bool = False) -> None:
        self.camera = camera
        self.initial = camera.copy()  # what `reset` goes back to
        self.animate = animate
        self._keys: set[str] = set()
        self._touches: dict[int, TouchPoint] = {}
        self._gamepad: GamepadEvent | None = None

    def reset(self) -> None:
        """Back to the initial framing."""
        self.camera = self.initial.copy()

    def frame(self, bounds_min: np.ndarray, bounds_max: np.ndarray) -> None:
        """Frame another scene's bounds, now and on `reset`."""
        self.initial = OrbitCamera.framed_on(bounds_min, bounds_max, fov_y=self.initial.fov_y)
        self.camera = self.initial.copy()

    def apply(self, event: CameraInput) -> None:
        if isinstance(event, PointerEvent):
            self._pointer(event)
        elif isinstance(event, WheelEvent):
            self.camera.zoom(math.exp(event.dy * ZOOM_PER_PIXEL))
        elif isinstance(event, KeyEvent):
            if event.code in MOVE_KEYS:
                (self._keys.add if event.action == "down" else self._keys.discard)(event.code)
        elif isinstance(event, TouchEvent):
            self._touch(event)
        elif isinstance(event, GamepadEvent):
            moving = any(_dead_zone(a) for a in event.axes) or any(
                _dead_zone(b) for b in event.buttons
            )
            self._gamepad = event if moving else None
        elif isinstance(event, BlurEvent):
            self._keys.clear()
            self._touches.clear()
            self._gamepad = None

    def tick(self, dt: float) -> None:
        """Advance held keys and animation by `dt` seconds (called once per frame)."""
        dt = min(max(dt, 0.0), 0.25)  # a stalled frame must not teleport the camera
        if self._keys:
            f = sum(MOVE_KEYS[k][0] for k in self._keys)
            r = sum(MOVE_KEYS[k][1] for k in self._keys)
            u = sum(MOVE_KEYS[k][2] for k in self._keys)
            step = MOVE_SPEED * self.camera.distance * dt
            self.camera.move(f * step, r * step, u * step)
        if self._gamepad is not None:
            self._tick_gamepad(self._gamepad, dt)
        if self.animate:
            self.camera.orbit(ANIMATE_YAW_PER_S * dt, 0.0)

    def _tick_gamepad(self, pad: GamepadEvent, dt: float) -> None:
        def axis(i: int) -> float:
            return _dead_zone(pad.axes[i]) if i < len(pad.axes) else 0.0

        def button(i: int) -> float:
            return _dead_zone(pad.buttons[i]) if i < len(pad.buttons) else 0.0

        forward, right = -axis(LEFT_Y), axis(LEFT_X)
        up = button(RIGHT_TRIGGER) - button(LEFT_TRIGGER)
        if forward or right or up:
            step = MOVE_SPEED * self.camera.distance * dt
            self.camera.move(forward * step, right * step, up * step)
        turn_x, turn_y = axis(RIGHT_X), axis(RIGHT_Y)
        if turn_x or turn_y:
            # as a drag does: the stick pushed right turns the scene the way a drag right does
            turn = GAMEPAD_ORBIT_PER_S * dt
            self.camera.orbit(-turn_x * turn, turn_y * turn)

    def snapshot(self) -> OrbitCamera:
        return self.camera.copy()

    def _pointer(self, event: PointerEvent) -> None:
        if event.action != "move" or (event.dx == 0 and event.dy == 0):
            return
        if not event.buttons and not event.locked:
            return  # a hover
        if event.buttons & (2 | 4) or ((event.buttons & 1 or event.locked) and event.shift):
            self.camera.pan(-event.dx, event.dy)
        elif event.buttons & 1 or event.locked:  # a left drag, or any move in pointer lock
            self.camera.orbit(-event.dx * ORBIT_PER_HEIGHT, event.dy * ORBIT_PER_HEIGHT)

    def _touch(self, event: TouchEvent) -> None:
        now = {t.id: t for t in event.touches}
        before = self._touches
        common = [i for i in now if i in before]
        if event.action == "move" and len(now) == 1 and len(common) == 1:
            (i,) = common
            dx, dy = now[i].x - before[i].x, now[i].y - before[i].y
            self.camera.orbit(-dx * ORBIT_PER_HEIGHT, dy * ORBIT_PER_HEIGHT)
        elif event.action == "move" and len(now) >= 2 and len(common) >= 2:
            a, b = common[:2]
            spread_before = math.dist((before[a].x, before[a].y), (before[b].x, before[b].y))
            spread_now = math.dist((now[a].x, now[a].y), (now[b].x, now[b].y))
            if spread_before > 1e-4 and spread_now > 1e-4:
                self.camera.zoom(spread_before / spread_now)  # fingers apart: closer
            cx = (now[a].x + now[b].x - before[a].x - before[b].x) / 2
            cy = (now[a].y + now[b].y - before[a].y - before[b].y) / 2
            self.camera.pan(-cx, cy)
        self._touches = now


def _dead_zone(value: float) -> float:
    """A stick or trigger value with the dead zone cut out and the rest rescaled to 0..1."""
    if abs(value) < GAMEPAD_DEAD_ZONE:
        return 0.0
    return math.copysign((abs(value) - GAMEPAD_DEAD_ZONE) / (1.0 - GAMEPAD_DEAD_ZONE), value)
