"""The visibility pass: clip and rasterize every triangle into a depth and a triangle-id buffer.

Fixed-point edge functions with SUBPIXEL steps and a top-left fill rule decide which pixel
centres a triangle covers, so triangles that share an edge cover its pixels exactly once. For
each drawn triangle the pass also stores its barycentric planes: the inverse of its clip-space
(x, y, w) columns, which gives perspective-correct barycentrics of the original triangle
however the clipper cut it, so the clipper carries no attributes. The shading pass reads them.

The CUDA kernels (shaders/raster.cu) follow this code operation for operation and take its
constants as -D flags (render/cuda/kernels.py). Numba bakes module globals into its on-disk
cache, which is keyed on this file alone: everything the kernels here read lives in this file.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SUBPIXEL = 256  # 8 bits of sub-pixel precision in the fixed-point edge functions
GUARD_BAND = 16.0  # clip |x|, |y| beyond 16·w so edge products stay far inside int64
SPAN_MIN_WIDTH = 12  # wider triangles are filled by exact per-row spans, narrower by edge tests
EMPTY_DEPTH = np.float32(-3.0e38)  # depth grows toward the viewer; finite so fastmath stays sound
PLANE_WIDTH = 10  # per triangle: three barycentric planes (i, j, constant), then its facing

# The kernels take numpy arrays and scalars whose types numba infers at the first call; they
# carry no annotations (hence the no-untyped-def ignores).


@njit(cache=True, nogil=True, error_model="numpy")
def visibility(positions, cull_back, vp, depth, ids, planes, row_lo, row_hi):  # type: ignore[no-untyped-def]
    """Visibility pass: nearest triangle id per pixel (−1: none) and its barycentric planes.

    For each drawn triangle t, planes[t] holds three screen-space planes e_k(i, j) whose
    normalized values e_k / Σe are the perspective-correct barycentrics at pixel (i, j).
    row_lo/row_hi bound the columns each row may have drawn (row_lo > row_hi: nothing).
    """
    height, width = depth.shape
    depth[:, :] = EMPTY_DEPTH
    ids[:, :] = -1
    row_lo[:] = width
    row_hi[:] = -1
    # pixel (i, j) centre → NDC: x = ax·i + bx, y = ay·j + by
    ax, bx = 2.0 / width, 1.0 / width - 1.0
    ay, by = -2.0 / height, 1.0 - 1.0 / height
    clip = np.empty((3, 4))
    poly = np.empty((2, 16, 4))
    drawn = 0
    for t in range(positions.shape[0]):
        for c in range(3):
            px, py, pz = positions[t, c, 0], positions[t, c, 1], positions[t, c, 2]
            for r in range(4):
                clip[c, r] = vp[r, 0] * px + vp[r, 1] * py + vp[r, 2] * pz + vp[r, 3]
        outside_all = 31
        need_clip = False
        for c in range(3):
            x, y, z, w = clip[c, 0], clip[c, 1], clip[c, 2], clip[c, 3]
            code = 0
            if x < -w:
                code |= 1
            if x > w:
                code |= 2
            if y < -w:
                code |= 4
            if y > w:
                code |= 8
            if z < -w:
                code |= 16
                need_clip = True
            if abs(x) > GUARD_BAND * w or abs(y) > GUARD_BAND * w:
                need_clip = True
            outside_all &= code
        if outside_all != 0:
            continue  # wholly outside one frustum plane

        # M = columns (x, y, w) of the corners; M⁻¹ maps (ndc x, ndc y, 1) to barycentrics / w.
        x0, y0, w0 = clip[0, 0], clip[0, 1], clip[0, 3]
        x1, y1, w1 = clip[1, 0], clip[1, 1], clip[1, 3]
        x2, y2, w2 = clip[2, 0], clip[2, 1], clip[2, 3]
        c00, c01, c02 = y1 * w2 - y2 * w1, y2 * w0 - y0 * w2, y0 * w1 - y1 * w0
        det = x0 * c00 + x1 * c01 + x2 * c02
        if det == 0.0 or (cull_back[t] != 0 and det < 0.0):
            continue  # edge-on, or facing away (det > 0: counter-clockwise on screen)
        inv = 1.0 / det
        # rows of M⁻¹ (the adjugate's rows over det), folded with the pixel → NDC map
        r00, r01, r02 = c00 * inv, (x2 * w1 - x1 * w2) * inv, (x1 * y2 - x2 * y1) * inv
        r10, r11, r12 = c01 * inv, (x0 * w2 - x2 * w0) * inv, (x2 * y0 - x0 * y2) * inv
        r20, r21, r22 = c02 * inv, (x1 * w0 - x0 * w1) * inv, (x0 * y1 - x1 * y0) * inv
        planes[t, 0], planes[t, 1], planes[t, 2] = r00 * ax, r01 * ay, r00 * bx + r01 * by + r02
        planes[t, 3], planes[t, 4], planes[t, 5] = r10 * ax, r11 * ay, r10 * bx + r11 * by + r12
        planes[t, 6], planes[t, 7], planes[t, 8] = r20 * ax, r21 * ay, r20 * bx + r21 * by + r22
        planes[t, 9] = 1.0 if det > 0.0 else -1.0
        # depth (w − z) / w = 1 − z_ndc, larger is nearer: Σ_k (w_k − z_k) · e_k
        q0, q1, q2 = w0 - clip[0, 2], w1 - clip[1, 2], w2 - clip[2, 2]
        d_i = q0 * planes[t, 0] + q1 * planes[t, 3] + q2 * planes[t, 6]
        d_j = q0 * planes[t, 1] + q1 * planes[t, 4] + q2 * planes[t, 7]
        d_c = q0 * planes[t, 2] + q1 * planes[t, 5] + q2 * planes[t, 8]

        if not need_clip:
            _fill(
                _fixed_x(x0 / w0, width), _fixed_y(y0 / w0, height),
                _fixed_x(x1 / w1, width), _fixed_y(y1 / w1, height),
                _fixed_x(x2 / w2, width), _fixed_y(y2 / w2, height),
                d_i, d_j, d_c, t, depth, ids, row_lo, row_hi,
            )  # fmt: skip
            drawn += 1
            continue

        n = 3
        for c in range(3):
            for r in range(4):
                poly[0, c, r] = clip[c, r]
        src = 0
        # near plane (z + w >= 0) first: after it every w is positive and the guard band tests
        # below mean what they say
        n = _clip_polygon(poly, src, n, 0.0, 0.0, 1.0, 1.0)
        src = 1 - src
        for plane in range(4):
            sx = -1.0 if plane == 0 else (1.0 if plane == 1 else 0.0)
            sy = -1.0 if plane == 2 else (1.0 if plane == 3 else 0.0)
            violated = False
            for c in range(n):
                if sx * poly[src, c, 0] + sy * poly[src, c, 1] + GUARD_BAND * poly[src, c, 3] < 0:
                    violated = True
            if violated:
                n = _clip_polygon(poly, src, n, sx, sy, 0.0, GUARD_BAND)
                src = 1 - src
        if n < 3:
            continue
        fx0 = _fixed_x(poly[src, 0, 0] / poly[src, 0, 3], width)
        fy0 = _fixed_y(poly[src, 0, 1] / poly[src, 0, 3], height)
        for c in range(1, n - 1):
            _fill(
                fx0, fy0,
                _fixed_x(poly[src, c, 0] / poly[src, c, 3], width),
                _fixed_y(poly[src, c, 1] / poly[src, c, 3], height),
                _fixed_x(poly[src, c + 1, 0] / poly[src, c + 1, 3], width),
                _fixed_y(poly[src, c + 1, 1] / poly[src, c + 1, 3], height),
                d_i, d_j, d_c, t, depth, ids, row_lo, row_hi,
            )  # fmt: skip
        drawn += 1
    return drawn


@njit(cache=True, nogil=True, inline="always")
def _fixed_x(ndc_x, width):  # type: ignore[no-untyped-def]
    return np.int64(math.floor((ndc_x * 0.5 + 0.5) * width * SUBPIXEL + 0.5))


@njit(cache=True, nogil=True, inline="always")
def _fixed_y(ndc_y, height):  # type: ignore[no-untyped-def]
    return np.int64(math.floor((0.5 - ndc_y * 0.5) * height * SUBPIXEL + 0.5))


@njit(cache=True, nogil=True, inline="always")
def _clip_polygon(poly, src, n, a, b, c, d):  # type: ignore[no-untyped-def]
    """Sutherland–Hodgman: keep the part of poly[src] where a·x + b·y + c·z + d·w >= 0."""
    dst = 1 - src
    m = 0
    for k in range(n):
        k2 = k + 1 if k + 1 < n else 0
        da = a * poly[src, k, 0] + b * poly[src, k, 1] + c * poly[src, k, 2] + d * poly[src, k, 3]
        db = a * poly[src, k2, 0] + b * poly[src, k2, 1] + c * poly[src, k2, 2]
        db += d * poly[src, k2, 3]
        if da >= 0.0:
            for r in range(4):
                poly[dst, m, r] = poly[src, k, r]
            m += 1
        if (da >= 0.0) != (db >= 0.0):
            s = da / (da - db)
            for r in range(4):
                poly[dst, m, r] = poly[src, k, r] + s * (poly[src, k2, r] - poly[src, k, r])
            m += 1
    return m


@njit(cache=True, nogil=True, fastmath=True)
def _fill(x0, y0, x1, y1, x2, y2, d_i, d_j, d_c, tid, depth, ids, row_lo, row_hi):  # type: ignore[no-untyped-def]
    """Depth-test and write the pixels whose centres a fixed-point triangle covers.

    Top-left fill rule: a pixel centre on an edge belongs to the triangle only if the edge is a
    top or a left edge, so triangles sharing an edge cover its pixels exactly once.
    """
    height, width = depth.shape
    area = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0)
    if area == 0:
        return
    if area < 0:  # make the corners run clockwise on the y-down screen, edges ≥ 0 inside
        x1, y1, x2, y2 = x2, y2, x1, y1
    half = SUBPIXEL // 2
    i_lo = max((min(x0, x1, x2) - half + SUBPIXEL - 1) // SUBPIXEL, 0)
    i_hi = min((max(x0, x1, x2) - half) // SUBPIXEL, width - 1)
    j_lo = max((min(y0, y1, y2) - half + SUBPIXEL - 1) // SUBPIXEL, 0)
    j_hi = min((max(y0, y1, y2) - half) // SUBPIXEL, height - 1)
    if i_lo > i_hi or j_lo > j_hi:
        return
    px = i_lo * SUBPIXEL + half
    py = j_lo * SUBPIXEL + half
    # edge k runs from corner a to corner b; value at the first pixel, steps per pixel
    f0, a0, b0 = _edge(x1, y1, x2, y2, px, py)
    f1, a1, b1 = _edge(x2, y2, x0, y0, px, py)
    f2, a2, b2 = _edge(x0, y0, x1, y1, px, py)
    tid32 = np.int32(tid)
    narrow = i_hi - i_lo < SPAN_MIN_WIDTH
    for j in range(j_lo, j_hi + 1):
        d_row = d_j * j + d_c
        if narrow:
            e0, e1, e2 = f0, f1, f2
            lo, hi = width, -1
            for i in range(i_lo, i_hi + 1):
                if (e0 | e1 | e2) >= 0:
                    z = np.float32(d_i * i + d_row)
                    if z > depth[j, i]:
                        depth[j, i] = z
                        ids[j, i] = tid
                    lo = min(lo, i)
                    hi = i
                e0 += a0
                e1 += a1
                e2 += a2
        else:
            # exact span: the columns where every edge value f + a·(i − i_lo) is ≥ 0
            lo, hi = i_lo, i_hi
            lo, hi = _span(f0, a0, i_lo, lo, hi)
            lo, hi = _span(f1, a1, i_lo, lo, hi)
            lo, hi = _span(f2, a2, i_lo, lo, hi)
            # branch-free and in 32-bit lanes, so that it vectorizes
            z0 = np.float32(d_i * lo + d_row)
            dz = np.float32(d_i)
            fn = np.float32(0.0)
            ju = np.uint64(j)
            for i in range(np.uint64(max(lo, 0)), np.uint64(hi + 1)):
                z = z0 + dz * fn
                old = depth[ju, i]
                closer = z > old
                depth[ju, i] = z if closer else old
                ids[ju, i] = tid32 if closer else ids[ju, i]
                fn += np.float32(1.0)
        if lo <= hi:
            row_lo[j] = min(row_lo[j], lo)
            row_hi[j] = max(row_hi[j], hi)
        f0 += b0
        f1 += b1
        f2 += b2


@njit(cache=True, nogil=True, inline="always")
def _edge(ax, ay, bx, by, px, py):  # type: ignore[no-untyped-def]
    """Edge a→b at point p, biased by −1 unless top-left, with its steps along i and j."""
    dx = bx - ax
    dy = by - ay
    value = dx * (py - ay) - dy * (px - ax)
    top_left = dy < 0 or (dy == 0 and dx > 0)
    if not top_left:
        value -= 1  # strict: a centre exactly on this edge is left to the neighbour
    return value, -dy * SUBPIXEL, dx * SUBPIXEL


@njit(cache=True, nogil=True, inline="always")
def _span(f, a, i0, lo, hi):  # type: ignore[no-untyped-def]
    """Narrow [lo, hi] to the columns i where f + a·(i − i0) >= 0."""
    if a > 0:
        if f < 0:
            lo = max(lo, i0 + (-f + a - 1) // a)
    elif a < 0:
        if f < 0:
            hi = -1
            lo = 0
        else:
            hi = min(hi, i0 + f // (-a))
    elif f < 0:
        hi = -1
        lo = 0
    return lo, hi
