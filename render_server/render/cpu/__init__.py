"""The CPU renderer: a rasterizer compiled by numba.

A frame is two passes over each band of rows, the bands taken by the calling thread and a
shared pool at once (`render.bands`). The visibility pass (`raster`) clips and rasterizes the
triangles that reach the band's rows into a depth buffer and a triangle-id buffer (runs of
triangles whose bounds miss the band or the view are skipped whole). The shading pass
(`shading`) then lights each pixel once from its triangle id, so its cost does not grow with
overdraw; the band's rows can then be converted to 4:2:0 by the same thread. Shadows come from
a shadow map drawn once per scene (`shadow_map`), since the scene and the sun never move.
Where the view misses the scene below the horizon it meets an endless floor at the scene's
lowest point, lit and shadowed like the rest.

    renderer.py    CpuRenderer: the two passes per band of rows
    prepare.py     the per-scene tables and per-frame view constants, shared with the CUDA
                   renderer (PreparedScene, prepare_scene, view_constants)
    raster.py      the visibility pass (numba)
    shading.py     the shading pass (numba): lighting, shadow-map lookups, tone mapping
    lighting.py    the material, light and tone tables the shading pass reads
    shadow_map.py  the sun's shadow map
"""

from render_server.render.cpu.renderer import CpuRenderer

__all__ = ["CpuRenderer"]
