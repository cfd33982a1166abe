"""What the worker asks of a renderer: a frame for a camera, at a size every renderer takes."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from render_server.render.camera import OrbitCamera


class Renderer(Protocol):
    """Draws one scene at a fixed size.

    `render` returns an (height, width, 3) uint8 C-contiguous RGB frame (sRGB). The array may be
    a buffer the renderer reuses: it is valid until the next `render` call, so a caller that
    keeps a frame longer copies it. The same camera state gives the same pixels.
    """

    width: int
    height: int

    def render(self, camera: OrbitCamera) -> np.ndarray: ...


MAX_SIDE = 8192  # pixels: a frame side past this is refused rather than allocated


def check_frame_size(width: int, height: int) -> None:
    """Raise ValueError unless every renderer accepts a `width` × `height` frame."""
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ValueError(f"frame size {width}x{height} is outside 1..{MAX_SIDE}")
