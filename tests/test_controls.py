"""Input events steer the orbit camera the way the README says."""

from __future__ import annotations

import math

import numpy as np
import pytest

from render_server.protocol.data_channel import (
    BlurEvent,
    GamepadEvent,
    KeyEvent,
    PointerEvent,
    TouchEvent,
    TouchPoint,
    WheelEvent,
)
from render_server.render import OrbitCamera
from render_server.stream.controls import CameraController


@pytest.fixture
def controller() -> CameraController:
    camera = OrbitCamera.framed_on((-5.0, 0.0, -5.0), (5.0, 3.0, 5.0))
    return CameraController(camera)


def drag(dx: float, dy: float, buttons: int = 1, shift: bool = False) -> PointerEvent:
    return PointerEvent("move", 0.5, 0.5, dx, dy, buttons, shift)


def test_left_drag_orbits(controller: CameraController) -> None:
    cam = controller.camera
    yaw, pitch, target = cam.yaw, cam.pitch, cam.target
    controller.apply(drag(0.1, 0.0))
    assert cam.yaw == pytest.approx(yaw - 0.1 * math.pi)
    controller.apply(drag(0.0, 0.05))
    assert cam.pitch == pytest.approx(pitch + 0.05 * math.pi)
    assert cam.target == target


def test_moves_without_buttons_do_nothing(controller: CameraController) -> None:
    before = controller.camera.state()
    controller.apply(drag(0.3, 0.3, buttons=0))
    assert controller.camera.state() == before


@pytest.mark.parametrize(("buttons", "shift"), [(2, False), (4, False), (1, True)])
def test_right_middle_and_shift_drag_pan(
    controller: CameraController, buttons: int, shift: bool
) -> None:
    cam = controller.camera
    yaw, target = cam.yaw, cam.target
    controller.apply(drag(0.1, 0.0, buttons, shift))
    assert cam.yaw == yaw
    assert cam.target != target


def test_wheel_zooms_both_ways(controller: CameraController) -> None:
    cam = controller.camera
    start = cam.distance
    controller.apply(WheelEvent(-100.0))
    assert cam.distance < start
    controller.apply(WheelEvent(200.0))
    assert cam.distance > start


def test_held_keys_move_until_released_or_blurred(controller: CameraController) -> None:
    cam = controller.camera
    start = cam.target
    controller.apply(KeyEvent("down", "KeyW"))
    controller.tick(0.1)
    moved = cam.target
    assert moved != start
    controller.apply(KeyEvent("up", "KeyW"))
    controller.tick(0.1)
    assert cam.target == moved
    controller.apply(KeyEvent("down", "ArrowLeft"))
    controller.apply(BlurEvent())  # focus lost: the key-up will never come
    controller.tick(0.1)
    assert cam.target == moved
    controller.apply(KeyEvent("down", "F5"))  # not a movement key: ignored
    controller.tick(0.1)
    assert cam.target == moved


def test_a_stalled_frame_does_not_teleport(controller: CameraController) -> None:
    cam = controller.camera
    controller.apply(KeyEvent("down", "KeyD"))
    start = cam.target
    controller.tick(30.0)
    step = math.dist(start, cam.target)
    assert step <= 0.8 * cam.distance * 0.25 + 1e-9


def test_touch_one_finger_orbits_two_fingers_pinch(controller: CameraController) -> None:
    cam = controller.camera
    yaw, distance = cam.yaw, cam.distance
    controller.apply(TouchEvent("start", (TouchPoint(1, 0.5, 0.5),)))
    controller.apply(TouchEvent("move", (TouchPoint(1, 0.6, 0.5),)))
    assert cam.yaw == pytest.approx(yaw - 0.1 * math.pi)
    controller.apply(TouchEvent("start", (TouchPoint(1, 0.6, 0.5), TouchPoint(2, 0.8, 0.5))))
    controller.apply(TouchEvent("move", (TouchPoint(1, 0.5, 0.5), TouchPoint(2, 0.9, 0.5))))
    assert cam.distance == pytest.approx(distance * 0.2 / 0.4)  # fingers apart: closer


def test_animate_turns_the_camera(controller: CameraController) -> None:
    controller.animate = True
    yaw = controller.camera.yaw
    controller.tick(0.1)
    assert controller.camera.yaw != yaw


def test_snapshots_are_independent(controller: CameraController) -> None:
    snap = controller.snapshot()
    controller.apply(drag(0.2, 0.0))
    assert snap.state() != controller.camera.state()


def test_a_locked_pointer_looks_around_without_buttons(controller: CameraController) -> None:
    cam = controller.camera
    yaw, pitch, target = cam.yaw, cam.pitch, cam.target
    controller.apply(PointerEvent("move", 0.5, 0.5, 0.1, 0.05, 0, locked=True))
    assert cam.yaw == pytest.approx(yaw - 0.1 * math.pi)
    assert cam.pitch == pytest.approx(pitch + 0.05 * math.pi)
    assert cam.target == target
    # with the right button, or shift, it pans as an unlocked drag does
    controller.apply(PointerEvent("move", 0.5, 0.5, 0.1, 0.0, 2, locked=True))
    controller.apply(PointerEvent("move", 0.5, 0.5, 0.1, 0.0, 0, shift=True, locked=True))
    assert cam.yaw == pytest.approx(yaw - 0.1 * math.pi)
    assert cam.target != target
    # unlocked, a move without buttons is a hover
    before = cam.state()
    controller.apply(PointerEvent("move", 0.5, 0.5, 0.1, 0.05, 0))
    assert cam.state() == before


def test_a_gamepads_sticks_move_and_orbit_over_ticks(controller: CameraController) -> None:
    cam = controller.camera
    yaw, target = cam.yaw, cam.target
    controller.apply(GamepadEvent(axes=(0.0, -1.0, 0.0, 0.0), buttons=()))  # left stick forward
    controller.tick(0.1)
    forward = np.subtract(cam.target, target)
    # as KeyW does: along the ground, away from the eye
    keyed = CameraController(OrbitCamera.framed_on((-5.0, 0.0, -5.0), (5.0, 3.0, 5.0)))
    keyed.apply(KeyEvent("down", "KeyW"))
    keyed.tick(0.1)
    assert forward == pytest.approx(np.subtract(keyed.camera.target, target))
    assert cam.yaw == yaw
    controller.tick(0.1)  # the state holds until the next one
    assert np.linalg.norm(np.subtract(cam.target, target)) == pytest.approx(
        2 * np.linalg.norm(forward)
    )
    moved = cam.target
    controller.apply(GamepadEvent(axes=(0.1, 0.1, 1.0, 0.0), buttons=()))  # dead zone; right
    controller.tick(0.1)
    assert cam.target == moved
    assert cam.yaw < yaw  # the right stick turns the way a drag to the right does
    turned = cam.yaw
    controller.apply(GamepadEvent(axes=(), buttons=(0.0,) * 7 + (1.0,)))  # right trigger: up
    controller.tick(0.1)
    assert cam.target[1] > moved[1] and cam.yaw == turned
    risen = cam.target
    controller.apply(GamepadEvent(axes=(0.05, 0.0, 0.0, 0.0), buttons=(0.0,) * 8))  # at rest
    controller.tick(0.1)
    assert cam.target == risen and cam.yaw == turned


def test_blur_stops_the_gamepad(controller: CameraController) -> None:
    cam = controller.camera
    controller.apply(GamepadEvent(axes=(1.0, 0.0, 0.0, 1.0), buttons=()))
    controller.tick(0.1)
    moved = cam.state()
    controller.apply(BlurEvent())
    controller.tick(0.1)
    assert cam.state() == moved


def test_reset_returns_to_the_initial_framing(controller: CameraController) -> None:
    start = controller.camera.state()
    controller.apply(drag(0.2, 0.1))
    controller.reset()
    assert controller.camera.state() == start
