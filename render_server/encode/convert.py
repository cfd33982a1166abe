"""Colour conversion from the renderer's RGB frames to the encoder's YUV 4:2:0.

A numba kernel writes straight into the planes of a new `av.VideoFrame`: swscale through PyAV
costs a copy into a frame plus a slow RGB→YUV path with a colour matrix (about 4 ms at 720p here,
against about 0.2 ms for this kernel).
"""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np
from numba import njit

from render_server.render.bands import run_in_bands, split_rows

# BT.709 limited range, the matrix marked in the H.264 VUI (see x264.py), so browsers decode with
# it. Coefficients are the matrix × 219/255 (luma) or × 224/255 (chroma) × 256, rounded; chroma
# is the mean of each 2×2 block (its sum of four, hence the shift by 10 rather than 8).


@njit(cache=True, nogil=True)
def _rgb_to_yuv420(  # pragma: no cover - compiled
    rgb: np.ndarray, y: np.ndarray, u: np.ndarray, v: np.ndarray
) -> None:
    """`rgb` as (H, W·3) bytes (R, G, B per pixel) into the planes. Luma, then chroma, row pair
    by row pair: plain loops over flat rows with unsigned indices, which LLVM vectorizes (one
    loop over 2×2 blocks with (H, W, 3) indexing ran about 7× slower)."""
    height, width = rgb.shape[0], rgb.shape[1] // 3
    one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
    for row in range(0, height, 2):
        top, bottom = rgb[row], rgb[row + 1]
        y_top, y_bottom = y[row], y[row + 1]
        u_row, v_row = u[row >> 1], v[row >> 1]
        for c in range(np.uint64(width)):
            p = c * three
            r, g, b = np.int32(top[p]), np.int32(top[p + one]), np.int32(top[p + two])
            y_top[c] = np.uint8((47 * r + 157 * g + 16 * b + 128 + (16 << 8)) >> 8)
            r, g, b = np.int32(bottom[p]), np.int32(bottom[p + one]), np.int32(bottom[p + two])
            y_bottom[c] = np.uint8((47 * r + 157 * g + 16 * b + 128 + (16 << 8)) >> 8)
        for k in range(np.uint64(width >> 1)):
            p = k * np.uint64(6)  # the block's top-left pixel; its right neighbour is p + 3
            rs = np.int32(top[p]) + np.int32(top[p + three])
            rs += np.int32(bottom[p]) + np.int32(bottom[p + three])
            gs = np.int32(top[p + one]) + np.int32(top[p + np.uint64(4)])
            gs += np.int32(bottom[p + one]) + np.int32(bottom[p + np.uint64(4)])
            bs = np.int32(top[p + two]) + np.int32(top[p + np.uint64(5)])
            bs += np.int32(bottom[p + two]) + np.int32(bottom[p + np.uint64(5)])
            u_row[k] = np.uint8((-26 * rs - 87 * gs + 112 * bs + 512 + (128 << 10)) >> 10)
            v_row[k] = np.uint8((112 * rs - 102 * gs - 10 * bs + 512 + (128 << 10)) >> 10)


def _bytes(rgb: np.ndarray) -> np.ndarray:
    """(H, W, 3) as (H, W·3): a view of a contiguous frame (a copy of any other)."""
    return rgb.reshape(rgb.shape[0], rgb.shape[1] * 3)


def _plane(frame: av.VideoFrame, index: int) -> np.ndarray:
    plane = frame.planes[index]
    rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
    return rows[:, : plane.width]


def _check(rgb: np.ndarray) -> None:
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError(f"expected an (H, W, 3) uint8 frame, got {rgb.shape} {rgb.dtype}")
    if rgb.shape[0] % 2 or rgb.shape[1] % 2:
        raise ValueError(f"4:2:0 needs even sides, got {rgb.shape[1]}x{rgb.shape[0]}")


def rgb_to_yuv420(rgb: np.ndarray) -> av.VideoFrame:
    """An (H, W, 3) uint8 RGB frame (even sides) as a new limited-range BT.709 yuv420p frame."""
    _check(rgb)
    frame = av.VideoFrame(rgb.shape[1], rgb.shape[0], "yuv420p")
    _rgb_to_yuv420(_bytes(rgb), _plane(frame, 0), _plane(frame, 1), _plane(frame, 2))
    return frame


class YuvConverter:
    """Converts into one reused frame: a fresh 4:2:0 buffer per frame costs page faults
    (first touch of new memory) that can exceed the conversion itself at 1080p and up.

    The frame returned is overwritten by the next call. Encoders copy their input while
    encoding, and `make_writable` copies first should anything still hold a reference.
    """

    def __init__(self, width: int, height: int, bands: int | None = None) -> None:
        self.frame = av.VideoFrame(width, height, "yuv420p")
        self._bands = split_rows(height, bands, step=2)  # whole 2×2 chroma blocks per band

    def convert(self, rgb: np.ndarray) -> av.VideoFrame:
        """`rgb` in the converter's frame, in bands of rows at once."""
        run_in_bands(self.rows(np.ascontiguousarray(rgb)), self._bands)
        return self.frame

    def rows(self, rgb: np.ndarray) -> Callable[[int, int], None]:
        """A function that converts rows [start, stop) of `rgb` (start even) into `frame`:
        the frame is `rgb` once every row has been. For converting bands as a renderer
        finishes them (`CpuRenderer.render`'s `each_band`): `rgb` may be unwritten yet, and
        must be C-contiguous (rows are read where they will be drawn, not copied now)."""
        _check(rgb)
        if not rgb.flags.c_contiguous:
            raise ValueError("the frame must be C-contiguous")
        if (rgb.shape[1], rgb.shape[0]) != (self.frame.width, self.frame.height):
            raise ValueError(
                f"frame is {rgb.shape[1]}x{rgb.shape[0]}, "
                f"converter is {self.frame.width}x{self.frame.height}"
            )
        self.frame.make_writable()
        y, u, v = (_plane(self.frame, i) for i in range(3))
        flat = _bytes(rgb)  # a view

        def convert(start: int, stop: int) -> None:
            half = slice(start // 2, stop // 2)
            _rgb_to_yuv420(flat[start:stop], y[start:stop], u[half], v[half])

        return convert
