"""The CUDA kernels as the renderers see them: where their sources are, how to compile them,
and each entry point's launch shape and parameters.

The kernels (render_server/shaders/*.cu) follow the CPU renderer's code operation for
operation; the constants they share with it, and the widths of the tables the host fills for
them, come from the Python modules as -D flags, so those modules stay their one source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from render_server.render.cpu import lighting, prepare, raster, shading

SHADERS_DIR = Path(__file__).resolve().parents[2] / "shaders"  # render_server/shaders
SHADER_FILES = ("raster.cu", "shade.cu", "convert.cu")
COMMON_HEADER = "common.cuh"
# No fused multiply-adds but the kernels' explicit ones, which stand where numba fuses in the
# CPU renderer (a pixel's depth): the rest of its visibility pass does not fuse (numba without
# fastmath), and without contraction the GPU computes exactly what the host emulation
# computes. Costs the shading a few percent of its arithmetic.
NVCC_OPTIONS = ("--fmad=false",)
# Doubles per triangle in the depth-plane table `setup` writes for the rasterizers (d_i, d_j,
# d_c): the GPU renderer's own layout, which `launch` allocates.
DEPTH_WIDTH = 3


@dataclass(frozen=True)
class KernelSpec:
    """An entry point of `shaders/*.cu`: `name(int count, ...)`.

    `args` lists the parameters after the count, pycuda's prepared-call codes: P a pointer,
    i an int32. `per_block`: one block of `block` threads per item (the lanes), else one
    thread per item.
    """

    name: str
    source: str
    args: str
    block: int
    per_block: bool = False


KERNELS = {
    spec.name: spec
    for spec in (
        KernelSpec("clear", "raster.cu", "PP", 256),
        KernelSpec("setup", "raster.cu", "PPPiiPPPiPiP", 128),
        KernelSpec("raster_small", "raster.cu", "PPiP", 128),
        KernelSpec("raster_large", "raster.cu", "PPiP", 256, per_block=True),
        KernelSpec("shade", "shade.cu", "PPPPPiPPPPiPiPiP", 256),
        KernelSpec("rgb_to_nv12", "convert.cu", "PiiiP", 256),
        KernelSpec("rgb_to_yuv420p", "convert.cu", "PiiP", 256),
    )
}


def shader_defines() -> dict[str, str]:
    """The constants the kernels share with the CPU renderer's kernels and the widths of the
    tables the host fills for them, as -D flags."""
    return {
        "SUBPIXEL": str(raster.SUBPIXEL),
        "GUARD_BAND": repr(float(raster.GUARD_BAND)),
        "SPAN_MIN_WIDTH": str(raster.SPAN_MIN_WIDTH),
        "EMPTY_DEPTH": f"({float(raster.EMPTY_DEPTH)!r}f)",
        "SHADOW_SIZE": str(shading.SHADOW_SIZE),
        "TILE": str(shading.TILE),
        "TILE_STEP": str(shading.TILE_STEP),
        "COARSE": str(shading.COARSE),
        "LUT_SIZE": str(shading.LUT_SIZE),
        "LUT_MAX": repr(float(shading.LUT_MAX)),
        "PLANE_WIDTH": str(raster.PLANE_WIDTH),
        "DEPTH_WIDTH": str(DEPTH_WIDTH),
        "TRIANGLE_WIDTH": str(prepare.TRIANGLE_WIDTH),
        "MATERIAL_WIDTH": str(lighting.MATERIAL_WIDTH),
    }


def shader_source(name: str) -> str:
    """The text of `shaders/name`; it includes common.cuh from SHADERS_DIR.

    (pycuda keys its compiler cache on the preprocessed text of sources that include files, so
    a change to the header recompiles.)
    """
    return (SHADERS_DIR / name).read_text()
