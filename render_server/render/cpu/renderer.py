"""`CpuRenderer`: a frame is the visibility pass, then the shading pass in bands of rows."""

from __future__ import annotations

import numpy as np

from render_server.render.bands import run_in_bands, split_rows
from render_server.render.camera import OrbitCamera
from render_server.render.cpu.prepare import prepare_scene, view_constants
from render_server.render.cpu.raster import PLANE_WIDTH, visibility
from render_server.render.cpu.shading import shade
from render_server.render.protocol import check_frame_size
from render_server.render.scene import Scene


class CpuRenderer:
    """Draws `scene` at `width` × `height` with numba kernels (which release the GIL).

    The visibility pass runs on the calling thread. The shading pass, about three quarters of
    a frame, is cut into `bands` bands of rows (default: `bands.DEFAULT_BANDS`, one per core
    up to 4): the calling thread shades the first, the process's shared band pool the others,
    and `render` returns when all are done.

    `render` returns a frame buffer owned by the renderer and overwritten by the next call.
    One renderer serves one thread at a time; create one per session. A scene object must not
    change once drawn: its tables and shadow map are built once per scene object and shared.
    To show an edited scene, build a new `Scene` and hand it to `set_scene`.
    """

    def __init__(self, scene: Scene, width: int, height: int, bands: int | None = None) -> None:
        check_frame_size(width, height)
        self._bands = split_rows(height, bands)
        self.width = width
        self.height = height
        self.set_scene(scene)
        self._depth = np.empty((height, width), dtype=np.float32)
        self._ids = np.empty((height, width), dtype=np.int32)  # the visible triangle, −1: none
        self._row_lo = np.empty(height, dtype=np.int32)
        self._row_hi = np.empty(height, dtype=np.int32)
        self._frame = np.empty((height, width, 3), dtype=np.uint8)

    def set_scene(self, scene: Scene) -> None:
        """Draw `scene` from the next frame on (its tables are built here unless cached)."""
        prepared = prepare_scene(scene)
        self.scene = scene
        self._prepared = prepared
        self._planes = np.zeros((scene.triangle_count, PLANE_WIDTH), dtype=np.float64)

    def render(self, camera: OrbitCamera) -> np.ndarray:
        """The frame for `camera`: (height, width, 3) uint8 sRGB, reused by the next call."""
        p = self._prepared
        visibility(
            p.positions, p.cull_back, camera.view_projection(self.width / self.height),
            self._depth, self._ids, self._planes, self._row_lo, self._row_hi,
        )  # fmt: skip
        view = view_constants(camera, self.width, self.height, p.floor)

        def shade_rows(start: int, stop: int) -> None:
            shade(
                self._ids, self._planes, p.triangles, p.material_ids, p.materials, view,
                p.light, p.shadow_matrix, p.shadow_tiles, p.shadow_coarse, p.lut, self._row_lo,
                self._row_hi, self._frame, start, stop,
            )  # fmt: skip

        run_in_bands(shade_rows, self._bands)
        return self._frame
