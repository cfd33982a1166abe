"""The CPU renderer: a rasterizer compiled by numba.

A frame is two passes. The visibility pass (`raster`) clips and rasterizes every triangle into
a depth buffer and a triangle-id buffer, on the calling thread. The shading pass (`shading`)
then lights each pixel once from its triangle id, so its cost does not grow with overdraw; it
runs in bands of rows at once (`render.bands`). Shadows come from a shadow map drawn once per
scene (`shadow_map`), since the scene and the sun never move. Where the view misses the scene
below the horizon it meets an endless floor at the scene's lowest point, lit and shadowed like
the rest.

    renderer.py    CpuRenderer: the two passes per frame
    prepare.py     the per-scene tables and per-frame view constants, shared with the CUDA
                   renderer (PreparedScene, prepare_scene, view_constants)
    raster.py      the visibility pass (numba)
    shading.py     the shading pass (numba): lighting, shadow-map lookups, tone mapping
    lighting.py    the material, light and tone tables the shading pass reads
    shadow_map.py  the sun's shadow map
"""

from render_server.render.cpu.renderer import CpuRenderer

__all__ = ["CpuRenderer"]
