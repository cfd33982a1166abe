"""Camera poses over the default scene that exercise the CPU renderer differently, shared by its
tests and `benchmarks/render.py`."""

from __future__ import annotations

from render_server.render import OrbitCamera, Scene


def poses(scene: Scene) -> dict[str, OrbitCamera]:
    """Framed, close, low over the ground plate looking along it (the ground then covers half
    the view and passes under and behind the camera), and from above."""
    framed = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    close = framed.copy()
    close.orbit(1.2, -0.2)
    close.zoom(0.6)
    ground = framed.copy()
    ground.target, ground.distance, ground.pitch = (0.0, 0.15, 0.0), 6.0, 0.02
    above = framed.copy()
    above.orbit(2.5, 0.6)
    return {"framed": framed, "close": close, "ground": ground, "above": above}
