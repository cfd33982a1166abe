"""The visibility pass: clip and rasterize every triangle into a depth and a triangle-id buffer.

Fixed-point edge functions with SUBPIXEL steps and a top-left fill rule decide which pixel
centres a triangle covers, so triangles that share an edge cover its pixels exactly once. For
each drawn triangle the pass also stores its barycentric planes: the inverse of its clip-space
(x, y, w) columns, which gives perspective-correct barycentrics of the original triangle
however the clipper cut it, so the clipper carries no attributes. The shading pass reads them.

The CPU renderer runs the pass in bands of rows at once (`visibility_rows`), each band skipping
the runs of triangles whose bounding boxes project outside it (`chunk_rows`).

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
CHUNK = 64  # triangles per bounding box (see `chunk_boxes`, `chunk_rows`)

# The kernels take numpy arrays and scalars whose types numba infers at the first call; they
# carry no annotations (hence the no-untyped-def ignores).


@njit(cache=True, nogil=True, error_model="numpy")
def visibility(positions, cull_back, vp, depth, ids, planes, row_lo, row_hi):  # type: ignore[no-untyped-def]
    """Visibility pass over the whole frame: `visibility_rows` for rows [0, height), with every
    triangle in one chunk that may meet every row."""
    every_row = np.array([[0, depth.shape[0] - 1]], dtype=np.int32)
    return visibility_rows(
        positions, cull_back, vp, depth, ids, planes, row_lo, row_hi, 0, depth.shape[0],
        every_row, max(positions.shape[0], 1),
    )  # fmt: skip


@njit(cache=True, nogil=True, error_model="numpy")
def visibility_rows(positions, cull_back, vp, depth, ids, planes, row_lo, row_hi, row_start, row_stop, chunk_rows, chunk):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """Visibility pass for rows [row_start, row_stop): nearest triangle id per pixel (−1: none)
    and the barycentric planes of the triangles drawn there.

    For each drawn triangle t, planes[t] holds three screen-space planes e_k(i, j) whose
    normalized values e_k / Σe are the perspective-correct barycentrics at pixel (i, j).
    row_lo/row_hi bound the columns each row may have drawn (row_lo > row_hi: nothing).

    Only the window's rows of depth, ids, row_lo and row_hi are written, so windows that
    partition the frame can run at once (the CPU renderer's bands; the CUDA kernels have no
    windows). Every pixel is decided exactly as over the whole frame: edge functions are
    integers and a row's depth depends on the row alone. A triangle whose rows miss the window
    is dropped before its planes are computed; the planes of one that meets several windows
    are written by each with the same bytes (the same arithmetic on the same inputs), so a
    window never reads a value that another could change.

    Triangles [b·chunk, (b + 1)·chunk) may draw only in rows chunk_rows[b] (first, last; see
    `chunk_rows`): chunks that miss the window are skipped whole. The bounds are conservative
    (the triangles skipped would draw nothing here), so they change no pixel.
    """
    height, width = depth.shape
    depth[row_start:row_stop, :] = EMPTY_DEPTH
    ids[row_start:row_stop, :] = -1
    row_lo[row_start:row_stop] = width
    row_hi[row_start:row_stop] = -1
    # pixel (i, j) centre → NDC: x = ax·i + bx, y = ay·j + by
    ax, bx = 2.0 / width, 1.0 / width - 1.0
    ay, by = -2.0 / height, 1.0 - 1.0 / height
    clip = np.empty((3, 4))
    poly = np.empty((2, 16, 4))
    fixed = np.empty((16, 2), dtype=np.int64)  # corners on screen, fixed point
    drawn = 0
    count = positions.shape[0]
    # the triangles of the chunks whose boxes may meet the window
    todo = np.empty(count, dtype=np.int64)
    m = 0
    for b in range((count + chunk - 1) // chunk):
        if chunk_rows[b, 1] < row_start or chunk_rows[b, 0] >= row_stop:
            continue
        for t in range(b * chunk, min(count, (b + 1) * chunk)):
            todo[m] = t
            m += 1
    for k in range(m):
        t = todo[k]
        # y and w first: a triangle in front of the eye whose corners project to rows well
        # clear of the window is dropped before anything else (clipping only shrinks it);
        # j_lo, j_hi: the corners' heights in rows from the top
        in_front = True
        j_lo, j_hi = np.inf, -np.inf
        for c in range(3):
            px, py, pz = positions[t, c, 0], positions[t, c, 1], positions[t, c, 2]
            for r in (1, 3):
                clip[c, r] = vp[r, 0] * px + vp[r, 1] * py + vp[r, 2] * pz + vp[r, 3]
            if clip[c, 3] > 0.0:
                row = (0.5 - 0.5 * clip[c, 1] / clip[c, 3]) * height
                j_lo, j_hi = min(j_lo, row), max(j_hi, row)
            else:
                in_front = False
        if in_front and (j_hi < row_start - 1.0 or j_lo > row_stop + 1.0):
            continue
        for c in range(3):
            px, py, pz = positions[t, c, 0], positions[t, c, 1], positions[t, c, 2]
            for r in (0, 2):
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

        n = 3
        if need_clip:
            for c in range(3):
                for r in range(4):
                    poly[0, c, r] = clip[c, r]
            src = 0
            # near plane (z + w >= 0) first: after it every w is positive and the guard band
            # tests below mean what they say
            n = _clip_polygon(poly, src, n, 0.0, 0.0, 1.0, 1.0)
            src = 1 - src
            for plane in range(4):
                sx = -1.0 if plane == 0 else (1.0 if plane == 1 else 0.0)
                sy = -1.0 if plane == 2 else (1.0 if plane == 3 else 0.0)
                violated = False
                for c in range(n):
                    side = sx * poly[src, c, 0] + sy * poly[src, c, 1]
                    if side + GUARD_BAND * poly[src, c, 3] < 0:
                        violated = True
                if violated:
                    n = _clip_polygon(poly, src, n, sx, sy, 0.0, GUARD_BAND)
                    src = 1 - src
            if n < 3:
                continue
            for c in range(n):
                fixed[c, 0] = _fixed_x(poly[src, c, 0] / poly[src, c, 3], width)
                fixed[c, 1] = _fixed_y(poly[src, c, 1] / poly[src, c, 3], height)
        else:
            fixed[0, 0], fixed[0, 1] = _fixed_x(x0 / w0, width), _fixed_y(y0 / w0, height)
            fixed[1, 0], fixed[1, 1] = _fixed_x(x1 / w1, width), _fixed_y(y1 / w1, height)
            fixed[2, 0], fixed[2, 1] = _fixed_x(x2 / w2, width), _fixed_y(y2 / w2, height)
        # the rows of pixel centres between the corners, as _fill finds them
        y_min, y_max = fixed[0, 1], fixed[0, 1]
        for c in range(1, n):
            y_min, y_max = min(y_min, fixed[c, 1]), max(y_max, fixed[c, 1])
        half = SUBPIXEL // 2
        first, last = (y_min - half + SUBPIXEL - 1) // SUBPIXEL, (y_max - half) // SUBPIXEL
        if last < row_start or first >= row_stop:
            continue

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
        for c in range(1, n - 1):  # a fan from the first corner: one triangle unless clipped
            _fill(
                fixed[0, 0], fixed[0, 1], fixed[c, 0], fixed[c, 1], fixed[c + 1, 0],
                fixed[c + 1, 1], d_i, d_j, d_c, t, depth, ids, row_lo, row_hi, row_start,
                row_stop,
            )  # fmt: skip
        drawn += 1
    return drawn


@njit(cache=True, nogil=True, error_model="numpy")
def chunk_rows(boxes, vp, height):  # type: ignore[no-untyped-def]
    """int32 (len(boxes), 2): the first and last row the triangles inside each box (min xyz,
    max xyz) may draw in; first > last where none (the box lies outside the view).

    The eight corners outside one plane of the view: no row. All in front of the eye: the rows
    between the corners' projections (y/w over a box in front of the eye is extreme at its
    corners; clipping only shrinks a triangle). Otherwise: every row. The margins (a
    millionth, two rows) cover the rounding of the triangles' own arithmetic.
    """
    rows = np.empty((boxes.shape[0], 2), dtype=np.int32)
    for b in range(boxes.shape[0]):
        outside_all = 31
        y_lo, y_hi = np.inf, -np.inf  # NDC y/w of the corners
        in_front = True
        for k in range(8):
            px = boxes[b, 3] if k & 1 else boxes[b, 0]
            py = boxes[b, 4] if k & 2 else boxes[b, 1]
            pz = boxes[b, 5] if k & 4 else boxes[b, 2]
            x = vp[0, 0] * px + vp[0, 1] * py + vp[0, 2] * pz + vp[0, 3]
            y = vp[1, 0] * px + vp[1, 1] * py + vp[1, 2] * pz + vp[1, 3]
            z = vp[2, 0] * px + vp[2, 1] * py + vp[2, 2] * pz + vp[2, 3]
            w = vp[3, 0] * px + vp[3, 1] * py + vp[3, 2] * pz + vp[3, 3]
            tol = 1e-6 * (abs(x) + abs(y) + abs(z) + abs(w))
            code = 0
            if x + w < -tol:
                code |= 1
            if w - x < -tol:
                code |= 2
            if y + w < -tol:
                code |= 4
            if w - y < -tol:
                code |= 8
            if z + w < -tol:
                code |= 16
            outside_all &= code
            if w > tol:
                y_lo, y_hi = min(y_lo, y / w), max(y_hi, y / w)
            else:
                in_front = False
        if outside_all != 0:
            rows[b, 0], rows[b, 1] = height, -1
        elif not in_front:
            rows[b, 0], rows[b, 1] = 0, height - 1
        else:  # pixel centre rows: NDC y = 1 − (2j + 1) / height
            top = (0.5 - 0.5 * y_hi) * height - 0.5 - 2.0
            bottom = (0.5 - 0.5 * y_lo) * height - 0.5 + 2.0
            rows[b, 0] = max(0.0, min(top, height))  # within int32 whatever y/w was
            rows[b, 1] = max(-1.0, min(bottom, height - 1))
    return rows


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
def _fill(x0, y0, x1, y1, x2, y2, d_i, d_j, d_c, tid, depth, ids, row_lo, row_hi, row_start, row_stop):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """Depth-test and write the pixels in rows [row_start, row_stop) whose centres a
    fixed-point triangle covers.

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
    j_lo = max((min(y0, y1, y2) - half + SUBPIXEL - 1) // SUBPIXEL, 0, row_start)
    j_hi = min((max(y0, y1, y2) - half) // SUBPIXEL, height - 1, row_stop - 1)
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


def chunk_boxes(positions: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """float32 (ceil(T / chunk), 6): min xyz, max xyz of triangles [b·chunk, (b + 1)·chunk).

    Scene files list a mesh's triangles together, so runs of them stay small in space: a band
    of rows, or a camera close to one part, skips most boxes without looking at a triangle.
    """
    count = positions.shape[0]
    corners = positions.reshape(-1, 3)
    padding = -count % chunk * 3  # the last chunk filled up with copies of its last corner
    if padding:
        corners = np.concatenate([corners, np.repeat(corners[-1:], padding, axis=0)])
    chunks = corners.reshape(-1, chunk * 3, 3)
    return np.concatenate([chunks.min(axis=1), chunks.max(axis=1)], axis=1).astype(np.float32)
