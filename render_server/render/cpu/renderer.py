"""`CpuRenderer`: a frame is bands of rows, each drawn by the visibility and the shading pass."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from render_server.render.bands import run_in_bands, split_rows
from render_server.render.camera import OrbitCamera
from render_server.render.cpu.prepare import prepare_scene, view_constants
from render_server.render.cpu.raster import (
    CHUNK,
    PLANE_WIDTH,
    chunk_boxes,
    chunk_rows,
    visibility_rows,
)
from render_server.render.cpu.shading import shade
from render_server.render.protocol import check_frame_size
from render_server.render.scene import Scene


class CpuRenderer:
    """Draws `scene` at `width` × `height` with numba kernels (which release the GIL).

    A frame is cut into `bands` bands of rows (default: `bands.DEFAULT_BANDS`, a few per
    core), taken one after another by the calling thread and the process's shared band pool
    (render/bands.py). A band is drawn whole by one thread: the visibility pass for its rows,
    then the shading pass for the same rows, with no wait for other bands in between (the
    passes read and write only the band's rows, but for the per-triangle planes, which bands
    write with identical values: see `raster.visibility_rows`). `render` returns when every
    band is done, with the same pixels whatever the bands.

    `render` returns a frame buffer, `frame`, owned by the renderer and overwritten by the
    next call. One renderer serves one thread at a time; create one per session. A scene
    object must not change once drawn: its tables and shadow map are built once per scene
    object and shared. To show an edited scene, build a new `Scene` and hand it to `set_scene`.
    """

    def __init__(self, scene: Scene, width: int, height: int, bands: int | None = None) -> None:
        check_frame_size(width, height)
        # even starts, so that a band's rows can be converted to 4:2:0 on their own
        self._bands = split_rows(height, bands, step=2)
        self.width = width
        self.height = height
        self.set_scene(scene)
        self._depth = np.empty((height, width), dtype=np.float32)
        self._ids = np.empty((height, width), dtype=np.int32)  # the visible triangle, −1: none
        self._row_lo = np.empty(height, dtype=np.int32)
        self._row_hi = np.empty(height, dtype=np.int32)
        self.frame = np.empty((height, width, 3), dtype=np.uint8)  # what `render` returns

    def set_scene(self, scene: Scene) -> None:
        """Draw `scene` from the next frame on (its tables are built here unless cached)."""
        prepared = prepare_scene(scene)
        self.scene = scene
        self._prepared = prepared
        self._boxes = chunk_boxes(prepared.positions)
        self._planes = np.zeros((scene.triangle_count, PLANE_WIDTH), dtype=np.float64)

    def render(
        self, camera: OrbitCamera, each_band: Callable[[int, int], None] | None = None
    ) -> np.ndarray:
        """The frame for `camera`: (height, width, 3) uint8 sRGB in `frame`, reused by the
        next call.

        `each_band(start, stop)`, if given, runs once the rows [start, stop) of `frame` are
        final, on the thread that drew them and while they are in its cache (a band starts on
        an even row: the colour conversion takes these rows to 4:2:0 as they come).
        """
        p = self._prepared
        vp = camera.view_projection(self.width / self.height)
        view = view_constants(camera, self.width, self.height, p.floor)
        depth, ids, planes, row_lo, row_hi = (
            self._depth, self._ids, self._planes, self._row_lo, self._row_hi
        )  # fmt: skip
        rows = chunk_rows(self._boxes, vp, self.height)  # which rows each chunk may draw in
        frame = self.frame

        def draw(start: int, stop: int) -> None:
            visibility_rows(
                p.positions, p.cull_back, vp, depth, ids, planes, row_lo, row_hi, start, stop,
                rows, CHUNK,
            )  # fmt: skip
            shade(
                ids, planes, p.triangles, p.material_ids, p.materials, view, p.light,
                p.shadow_matrix, p.shadow_tiles, p.shadow_coarse, p.lut, row_lo, row_hi, frame,
                start, stop,
            )  # fmt: skip
            if each_band is not None:
                each_band(start, stop)

        run_in_bands(draw, self._bands)
        return self.frame
