"""Render the default scene's reference frame that tests/test_render.py compares against.

    python -m tests.make_reference

Run it after a deliberate change to how the scene looks, look at the PNG, and commit it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from render_server.render import CpuRenderer, OrbitCamera, Scene, default_scene

REFERENCE = Path(__file__).parent / "data" / "default_320x180.png"
WIDTH, HEIGHT = 320, 180


def reference_camera(scene: Scene) -> OrbitCamera:
    """The first view a user gets of the scene."""
    return OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)


def render_reference(scene: Scene) -> np.ndarray:
    return CpuRenderer(scene, WIDTH, HEIGHT).render(reference_camera(scene)).copy()


def main() -> None:
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(render_reference(default_scene())).save(REFERENCE)
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    main()
