"""What the worker asks of a renderer: a frame for a camera."""

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
