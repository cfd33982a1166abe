"""How many of a set of 2D triangles cover each pixel, through each renderer's visibility pass.

Each triangle is drawn on its own, so the counts show the fill rule: triangles that share an
edge must cover every pixel along it exactly once.
"""

from __future__ import annotations

import numpy as np

from render_server.render import Material, Scene
from render_server.render.cpu.raster import PLANE_WIDTH, visibility
from render_server.render.cuda.emulation import EmulatedCudaRenderer


def flat_view() -> np.ndarray:
    """A view-projection that keeps NDC x and y and puts every corner at z = 0, mid-depth,
    where nothing is clipped."""
    vp = np.eye(4)
    vp[2, 2] = 0.0
    return vp


def triangles_at_mid_depth(triangles_ndc: np.ndarray) -> np.ndarray:
    """(N, 3, 2) triangles in NDC (y up) as (N, 3, 3) float32 positions at z = 0."""
    tris = np.asarray(triangles_ndc, dtype=np.float32).reshape(-1, 3, 2)
    positions = np.zeros((len(tris), 3, 3), np.float32)
    positions[:, :, :2] = tris
    return positions


def cpu_coverage(triangles_ndc: np.ndarray, width: int, height: int) -> np.ndarray:
    """Coverage counts (height, width) through the CPU renderer's visibility pass."""
    counts = np.zeros((height, width), dtype=np.int32)
    depth = np.empty((height, width), dtype=np.float32)
    ids = np.empty((height, width), dtype=np.int32)
    row_lo = np.empty(height, dtype=np.int32)
    row_hi = np.empty(height, dtype=np.int32)
    vp = flat_view()
    for positions in triangles_at_mid_depth(triangles_ndc):
        planes = np.zeros((1, PLANE_WIDTH), dtype=np.float64)
        cull_nothing = np.zeros(1, np.uint8)
        visibility(positions[None], cull_nothing, vp, depth, ids, planes, row_lo, row_hi)
        counts += ids >= 0
    return counts


def emulated_coverage(triangles_ndc: np.ndarray, width: int, height: int) -> np.ndarray:
    """Coverage counts (height, width) through the CUDA kernels, run on the host."""
    positions = triangles_at_mid_depth(triangles_ndc)
    normals = np.zeros_like(positions)
    normals[:, :, 2] = 1.0
    both_sides = Material("coverage", (1.0, 1.0, 1.0), 1.0, 0.0, True)  # cull nothing
    scene = Scene(positions, normals, np.zeros(len(positions), np.int32), [both_sides])
    vp = flat_view()
    counts = np.zeros((height, width), np.int32)
    with EmulatedCudaRenderer(scene, width, height) as renderer:
        for k in range(len(positions)):
            counts += renderer.pipeline.keys(vp, first=k, count=1) != 0
    return counts
