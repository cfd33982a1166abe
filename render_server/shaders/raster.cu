// Visibility: the CPU renderer's `visibility` (render_server/render/cpu/raster.py) as four
// kernels.
//
//   clear         one thread per pixel: key = 0 (empty); item 0 also zeroes the job counters
//   setup         one thread per triangle: transform, cull, barycentric and depth planes, clip,
//                 and the raster jobs of what is left (appended with atomicAdd)
//   raster_small  one thread per small job: walks the job's rows
//   raster_large  one block per large job (a band of at most BAND_ROWS rows of one triangle):
//                 a warp per row, its lanes stride along the row
//
// A pixel's key packs the depth (orderable float bits, larger is nearer) above the complement
// of the triangle id, and 64-bit atomicMax keeps the largest: the nearest triangle, and on a
// tie the earliest, exactly what the CPU's sequential `z > depth` test keeps, whatever order
// the jobs run in. Key 0 is "no triangle".
//
// The arithmetic follows raster.py operation for operation (float64 where it uses float64, fused
// multiply-adds exactly where numba emits them) so that coverage, depth and thus triangle ids
// match the CPU renderer's. Consumer GPUs run float64 at 1/32-1/64 of the float32 rate; here
// it is spent once per triangle in `setup` and once per covered row in the rasterizers, not
// per pixel, so it costs little even there.
#include "common.cuh"

#ifndef SUBPIXEL
#define SUBPIXEL 256  // 8 bits of sub-pixel precision (raster.SUBPIXEL)
#endif
#ifndef GUARD_BAND
#define GUARD_BAND 16.0  // clip |x|, |y| beyond 16·w (raster.GUARD_BAND)
#endif
#ifndef SPAN_MIN_WIDTH
#define SPAN_MIN_WIDTH 12  // wider bounding boxes are filled by spans (raster.SPAN_MIN_WIDTH)
#endif
#ifndef EMPTY_DEPTH
#define EMPTY_DEPTH (-3.0e38f)  // raster.EMPTY_DEPTH: a depth no drawn pixel has
#endif

#ifndef PLANE_WIDTH
#define PLANE_WIDTH 10  // barycentric planes per triangle (raster.PLANE_WIDTH)
#endif
#ifndef DEPTH_WIDTH
#define DEPTH_WIDTH 3  // depth plane d_i, d_j, d_c per triangle (kernels.DEPTH_WIDTH)
#endif

#define JOB_INTS 8       // tid, x0, y0, x1, y1, x2, y2 (fixed point, clockwise), rows
#define SMALL_JOB_PIXELS 128  // bounding boxes up to this many pixels: one thread
#define BAND_ROWS 8      // rows per large job: one warp each in a block of 256 threads
#define WARP 32
#define FIXED_LIMIT 1073741824LL  // |fixed-point coordinate| bound: jobs store int32

// -- clear ---------------------------------------------------------------------------------

RS_DEVICE void clear_body(int pixel, rs_u64* keys, rs_u64* counters) {
    keys[pixel] = 0ULL;
    if (pixel == 0) {
        counters[0] = 0ULL;  // small jobs
        counters[1] = 0ULL;  // large jobs (bands): 64 bits, so that no count wraps around
    }
}

RS_KERNEL_PER_ITEM(clear, (rs_u64* keys, rs_u64* counters), (keys, counters))

// -- setup ---------------------------------------------------------------------------------

RS_DEVICE rs_i64 fixed_coord(double ndc, int size, int flip) {
    // raster._fixed_x / _fixed_y: floor((ndc·0.5 + 0.5)·size·SUBPIXEL + 0.5), y flipped
    double unit = flip ? (0.5 - ndc * 0.5) : (ndc * 0.5 + 0.5);
    double v = floor(unit * (double)size * (double)SUBPIXEL + 0.5);
    // after the guard band |ndc| <= 16 (plus rounding): this bound only keeps NaN and
    // impossible values from becoming undefined conversions
    if (!(v > (double)-FIXED_LIMIT)) return -FIXED_LIMIT;
    if (v > (double)FIXED_LIMIT) return FIXED_LIMIT;
    return (rs_i64)v;
}

// Rows of a job: first | last << 16 (heights are at most 8192).
RS_DEVICE int pack_rows(int first, int last) { return first | (last << 16); }

RS_DEVICE void write_job(int* jobs, rs_u64 slot, int tid, const rs_i64* c, int rows) {
    int* job = jobs + (size_t)slot * JOB_INTS;
    job[0] = tid;
    for (int k = 0; k < 6; ++k) job[1 + k] = (int)c[k];
    job[7] = rows;
}

// The fill of one (sub)triangle in fixed point: what raster._fill would draw, as jobs.
RS_DEVICE void emit_jobs(int tid, rs_i64 x0, rs_i64 y0, rs_i64 x1, rs_i64 y1, rs_i64 x2,
                         rs_i64 y2, int width, int height, int* small_jobs, int small_capacity,
                         int* large_jobs, int large_capacity, rs_u64* counters) {
    rs_i64 area = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0);
    if (area == 0) return;
    if (area < 0) {  // clockwise on the y-down screen: edge functions are >= 0 inside
        rs_i64 tx = x1, ty = y1;
        x1 = x2; y1 = y2;
        x2 = tx; y2 = ty;
    }
    const rs_i64 half = SUBPIXEL / 2;
    rs_i64 i_lo = rs_max64(rs_floor_div(rs_min64(x0, rs_min64(x1, x2)) - half + SUBPIXEL - 1, SUBPIXEL), 0);
    rs_i64 i_hi = rs_min64(rs_floor_div(rs_max64(x0, rs_max64(x1, x2)) - half, SUBPIXEL), width - 1);
    rs_i64 j_lo = rs_max64(rs_floor_div(rs_min64(y0, rs_min64(y1, y2)) - half + SUBPIXEL - 1, SUBPIXEL), 0);
    rs_i64 j_hi = rs_min64(rs_floor_div(rs_max64(y0, rs_max64(y1, y2)) - half, SUBPIXEL), height - 1);
    if (i_lo > i_hi || j_lo > j_hi) return;
    rs_i64 corners[6] = {x0, y0, x1, y1, x2, y2};
    rs_i64 rows = j_hi - j_lo + 1;
    if ((i_hi - i_lo + 1) * rows <= SMALL_JOB_PIXELS) {
        rs_u64 slot = rs_atomic_inc_u64(&counters[0]);
        if (slot < (rs_u64)small_capacity)
            write_job(small_jobs, slot, tid, corners, pack_rows((int)j_lo, (int)j_hi));
        return;
    }
    // a large fill becomes bands of BAND_ROWS rows, one block each, so that a triangle that
    // covers the screen keeps every multiprocessor busy
    rs_u64 bands = (rs_u64)((rows + BAND_ROWS - 1) / BAND_ROWS);
    rs_u64 first = rs_atomic_add_u64(&counters[1], bands);
    for (rs_u64 b = 0; b < bands; ++b) {
        if (first + b >= (rs_u64)large_capacity) break;  // the host sees the count and retries
        int lo = (int)j_lo + (int)b * BAND_ROWS;
        int hi = rs_mini(lo + BAND_ROWS - 1, (int)j_hi);
        write_job(large_jobs, first + b, tid, corners, pack_rows(lo, hi));
    }
}

// raster._clip_polygon: keep the part of poly[src] where a·x + b·y + c·z + d·w >= 0.
RS_DEVICE int clip_polygon(double poly[2][16][4], int src, int n, double a, double b, double c,
                           double d) {
    int dst = 1 - src;
    int m = 0;
    for (int k = 0; k < n; ++k) {
        int k2 = k + 1 < n ? k + 1 : 0;
        double da = a * poly[src][k][0] + b * poly[src][k][1] + c * poly[src][k][2] + d * poly[src][k][3];
        double db = a * poly[src][k2][0] + b * poly[src][k2][1] + c * poly[src][k2][2];
        db += d * poly[src][k2][3];
        if (da >= 0.0) {
            for (int r = 0; r < 4; ++r) poly[dst][m][r] = poly[src][k][r];
            m += 1;
        }
        if ((da >= 0.0) != (db >= 0.0)) {
            double s = da / (da - db);
            for (int r = 0; r < 4; ++r)
                poly[dst][m][r] = poly[src][k][r] + s * (poly[src][k2][r] - poly[src][k][r]);
            m += 1;
        }
    }
    return m;
}

// The near and guard-band clipper and the fan of what is left (rare: kept out of line so that
// its 1 KiB of per-thread polygon stays out of the common path's registers).
RS_NOINLINE void clip_and_emit(int tid, const double clip[3][4], int width, int height,
                               int* small_jobs, int small_capacity, int* large_jobs,
                               int large_capacity, rs_u64* counters) {
    double poly[2][16][4];
    for (int c = 0; c < 3; ++c)
        for (int r = 0; r < 4; ++r) poly[0][c][r] = clip[c][r];
    int n = 3;
    int src = 0;
    // near plane (z + w >= 0) first: after it every w is positive
    n = clip_polygon(poly, src, n, 0.0, 0.0, 1.0, 1.0);
    src = 1 - src;
    for (int plane = 0; plane < 4; ++plane) {
        double sx = plane == 0 ? -1.0 : (plane == 1 ? 1.0 : 0.0);
        double sy = plane == 2 ? -1.0 : (plane == 3 ? 1.0 : 0.0);
        bool violated = false;
        for (int c = 0; c < n; ++c)
            if (sx * poly[src][c][0] + sy * poly[src][c][1] + GUARD_BAND * poly[src][c][3] < 0)
                violated = true;
        if (violated) {
            n = clip_polygon(poly, src, n, sx, sy, 0.0, GUARD_BAND);
            src = 1 - src;
        }
    }
    if (n < 3) return;
    rs_i64 fx0 = fixed_coord(poly[src][0][0] / poly[src][0][3], width, 0);
    rs_i64 fy0 = fixed_coord(poly[src][0][1] / poly[src][0][3], height, 1);
    for (int c = 1; c < n - 1; ++c) {
        emit_jobs(tid, fx0, fy0,
                  fixed_coord(poly[src][c][0] / poly[src][c][3], width, 0),
                  fixed_coord(poly[src][c][1] / poly[src][c][3], height, 1),
                  fixed_coord(poly[src][c + 1][0] / poly[src][c + 1][3], width, 0),
                  fixed_coord(poly[src][c + 1][1] / poly[src][c + 1][3], height, 1),
                  width, height, small_jobs, small_capacity, large_jobs, large_capacity,
                  counters);
    }
}

RS_DEVICE void setup_body(int t, const float* positions, const rs_u8* cull_back,
                          const double* frame, int width, int height, double* planes,
                          double* depth_planes, int* small_jobs, int small_capacity,
                          int* large_jobs, int large_capacity, rs_u64* counters) {
    const double* vp = frame;  // world → clip, row-major 4×4
    double clip[3][4];
    for (int c = 0; c < 3; ++c) {
        double px = positions[(size_t)t * 9 + c * 3 + 0];
        double py = positions[(size_t)t * 9 + c * 3 + 1];
        double pz = positions[(size_t)t * 9 + c * 3 + 2];
        for (int r = 0; r < 4; ++r)
            clip[c][r] = vp[r * 4 + 0] * px + vp[r * 4 + 1] * py + vp[r * 4 + 2] * pz + vp[r * 4 + 3];
    }
    int outside_all = 31;
    bool need_clip = false;
    for (int c = 0; c < 3; ++c) {
        double x = clip[c][0], y = clip[c][1], z = clip[c][2], w = clip[c][3];
        int code = 0;
        if (x < -w) code |= 1;
        if (x > w) code |= 2;
        if (y < -w) code |= 4;
        if (y > w) code |= 8;
        if (z < -w) {
            code |= 16;
            need_clip = true;
        }
        if (fabs(x) > GUARD_BAND * w || fabs(y) > GUARD_BAND * w) need_clip = true;
        outside_all &= code;
    }
    if (outside_all != 0) return;  // wholly outside one frustum plane

    // M = columns (x, y, w) of the corners; M⁻¹ maps (ndc x, ndc y, 1) to barycentrics / w
    double x0 = clip[0][0], y0 = clip[0][1], w0 = clip[0][3];
    double x1 = clip[1][0], y1 = clip[1][1], w1 = clip[1][3];
    double x2 = clip[2][0], y2 = clip[2][1], w2 = clip[2][3];
    double c00 = y1 * w2 - y2 * w1, c01 = y2 * w0 - y0 * w2, c02 = y0 * w1 - y1 * w0;
    double det = x0 * c00 + x1 * c01 + x2 * c02;
    if (det == 0.0 || (cull_back[t] != 0 && det < 0.0)) return;  // edge-on, or facing away
    double inv = 1.0 / det;
    double r00 = c00 * inv, r01 = (x2 * w1 - x1 * w2) * inv, r02 = (x1 * y2 - x2 * y1) * inv;
    double r10 = c01 * inv, r11 = (x0 * w2 - x2 * w0) * inv, r12 = (x2 * y0 - x0 * y2) * inv;
    double r20 = c02 * inv, r21 = (x1 * w0 - x0 * w1) * inv, r22 = (x0 * y1 - x1 * y0) * inv;
    // pixel (i, j) centre → NDC: x = ax·i + bx, y = ay·j + by
    double ax = 2.0 / width, bx = 1.0 / width - 1.0;
    double ay = -2.0 / height, by = 1.0 - 1.0 / height;
    double p[PLANE_WIDTH];
    p[0] = r00 * ax; p[1] = r01 * ay; p[2] = r00 * bx + r01 * by + r02;
    p[3] = r10 * ax; p[4] = r11 * ay; p[5] = r10 * bx + r11 * by + r12;
    p[6] = r20 * ax; p[7] = r21 * ay; p[8] = r20 * bx + r21 * by + r22;
    p[9] = det > 0.0 ? 1.0 : -1.0;  // −1: the back of a double-sided surface
    for (int k = 0; k < PLANE_WIDTH; ++k) planes[(size_t)t * PLANE_WIDTH + k] = p[k];
    // depth (w − z) / w = 1 − z_ndc, larger is nearer: Σ_k (w_k − z_k) · e_k
    double q0 = w0 - clip[0][2], q1 = w1 - clip[1][2], q2 = w2 - clip[2][2];
    double* dp = depth_planes + (size_t)t * DEPTH_WIDTH;
    dp[0] = q0 * p[0] + q1 * p[3] + q2 * p[6];
    dp[1] = q0 * p[1] + q1 * p[4] + q2 * p[7];
    dp[2] = q0 * p[2] + q1 * p[5] + q2 * p[8];

    if (!need_clip) {
        emit_jobs(t, fixed_coord(x0 / w0, width, 0), fixed_coord(y0 / w0, height, 1),
                  fixed_coord(x1 / w1, width, 0), fixed_coord(y1 / w1, height, 1),
                  fixed_coord(x2 / w2, width, 0), fixed_coord(y2 / w2, height, 1), width,
                  height, small_jobs, small_capacity, large_jobs, large_capacity, counters);
        return;
    }
    clip_and_emit(t, clip, width, height, small_jobs, small_capacity, large_jobs,
                  large_capacity, counters);
}

RS_KERNEL_PER_ITEM(setup,
                   (const float* positions, const rs_u8* cull_back, const double* frame,
                    int width, int height, double* planes, double* depth_planes,
                    int* small_jobs, int small_capacity, int* large_jobs, int large_capacity,
                    rs_u64* counters),
                   (positions, cull_back, frame, width, height, planes, depth_planes,
                    small_jobs, small_capacity, large_jobs, large_capacity, counters))

// -- rasterization -------------------------------------------------------------------------

// The visibility key of depth z for triangle tid (raster.py: `z > depth` against EMPTY_DEPTH).
RS_DEVICE void depth_test(rs_u64* keys, size_t pixel, float z, int tid) {
    if (!(z > EMPTY_DEPTH)) return;  // what the CPU never draws, NaN included
    if (z == 0.0f) z = 0.0f;         // −0 ties with +0 in the CPU's float compare
    rs_u32 bits = rs_float_bits(z);
    bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // orders as the floats do
    rs_u64 key = ((rs_u64)bits << 32) | (rs_u64)(0xFFFFFFFFu - (rs_u32)tid);
    rs_u64* slot = keys + pixel;
    if (key > *slot) rs_atomic_max_u64(slot, key);  // keys only grow: skip hopeless atomics
}

// raster._span: narrow [lo, hi] to the columns i where f + a·(i − i0) >= 0.
RS_DEVICE void span(rs_i64 f, rs_i64 a, rs_i64 i0, rs_i64* lo, rs_i64* hi) {
    if (a > 0) {
        if (f < 0) *lo = rs_max64(*lo, i0 + rs_floor_div(-f + a - 1, a));
    } else if (a < 0) {
        if (f < 0) {
            *hi = -1;
            *lo = 0;
        } else {
            *hi = rs_min64(*hi, i0 + rs_floor_div(f, -a));
        }
    } else if (f < 0) {
        *hi = -1;
        *lo = 0;
    }
}

// Edge a→b at the pixel centre (px, py): raster._edge (biased by −1 unless top-left).
RS_DEVICE rs_i64 edge_value(rs_i64 ax, rs_i64 ay, rs_i64 bx, rs_i64 by, rs_i64 px, rs_i64 py) {
    rs_i64 dx = bx - ax, dy = by - ay;
    rs_i64 value = dx * (py - ay) - dy * (px - ax);
    bool top_left = dy < 0 || (dy == 0 && dx > 0);
    return top_left ? value : value - 1;
}

// Rows first + row_offset, first + row_offset + row_step, … of a job; columns col_offset,
// col_offset + col_step, … of each row's pixels. raster._fill, with its two ways of computing a
// pixel's depth: directly in narrow boxes, stepped along the row's span in wide ones.
RS_DEVICE void raster_rows(const int* job, int row_offset, int row_step, int col_offset,
                           int col_step, const double* depth_planes, int width, rs_u64* keys) {
    int tid = job[0];
    rs_i64 x0 = job[1], y0 = job[2], x1 = job[3], y1 = job[4], x2 = job[5], y2 = job[6];
    int first = job[7] & 0xFFFF, last = job[7] >> 16;
    const rs_i64 half = SUBPIXEL / 2;
    rs_i64 i_lo = rs_max64(rs_floor_div(rs_min64(x0, rs_min64(x1, x2)) - half + SUBPIXEL - 1, SUBPIXEL), 0);
    rs_i64 i_hi = rs_min64(rs_floor_div(rs_max64(x0, rs_max64(x1, x2)) - half, SUBPIXEL), width - 1);
    bool narrow = i_hi - i_lo < SPAN_MIN_WIDTH;
    rs_i64 px = i_lo * SUBPIXEL + half;
    // steps along i of the three edges (1→2, 2→0, 0→1)
    rs_i64 a0 = -(y2 - y1) * SUBPIXEL, a1 = -(y0 - y2) * SUBPIXEL, a2 = -(y1 - y0) * SUBPIXEL;
    const double* dp = depth_planes + (size_t)tid * DEPTH_WIDTH;
    double d_i = dp[0], d_j = dp[1], d_c = dp[2];
    RS_NO_UNROLL
    for (int j = first + row_offset; j <= last; j += row_step) {
        rs_i64 py = (rs_i64)j * SUBPIXEL + half;
        rs_i64 f0 = edge_value(x1, y1, x2, y2, px, py);
        rs_i64 f1 = edge_value(x2, y2, x0, y0, px, py);
        rs_i64 f2 = edge_value(x0, y0, x1, y1, px, py);
        double d_row = fma(d_j, (double)j, d_c);  // numba fuses d_j·j + d_c
        size_t row = (size_t)j * (size_t)width;
        if (narrow) {
            RS_NO_UNROLL
            for (rs_i64 i = i_lo + col_offset; i <= i_hi; i += col_step) {
                rs_i64 n = i - i_lo;
                if (((f0 + a0 * n) | (f1 + a1 * n) | (f2 + a2 * n)) >= 0)
                    depth_test(keys, row + (size_t)i, (float)fma(d_i, (double)i, d_row), tid);
            }
        } else {
            rs_i64 lo = i_lo, hi = i_hi;
            span(f0, a0, i_lo, &lo, &hi);
            span(f1, a1, i_lo, &lo, &hi);
            span(f2, a2, i_lo, &lo, &hi);
            if (lo > hi) continue;
            // the CPU's vectorized span loop: z = z0 + dz·n in float32, fused
            float z0 = (float)fma(d_i, (double)lo, d_row);
            float dz = (float)d_i;
            RS_NO_UNROLL
            for (rs_i64 i = lo + col_offset; i <= hi; i += col_step)
                depth_test(keys, row + (size_t)i, fmaf(dz, (float)(i - lo), z0), tid);
        }
    }
}

RS_DEVICE void raster_small_body(int job, const int* jobs, const double* depth_planes,
                                 int width, rs_u64* keys) {
    raster_rows(jobs + (size_t)job * JOB_INTS, 0, 1, 0, 1, depth_planes, width, keys);
}

RS_KERNEL_PER_ITEM(raster_small,
                   (const int* jobs, const double* depth_planes, int width, rs_u64* keys),
                   (jobs, depth_planes, width, keys))

RS_DEVICE void raster_large_body(int job, int lane, int lanes, const int* jobs,
                                 const double* depth_planes, int width, rs_u64* keys) {
    // a warp per row, lanes along the row; fewer than WARP lanes: all of them on each row
    int group = lanes >= WARP ? lane / WARP : 0;
    int groups = lanes >= WARP ? lanes / WARP : 1;
    int column = lanes >= WARP ? lane % WARP : lane;
    int columns = lanes >= WARP ? WARP : lanes;
    if (group >= groups) return;  // a block size that is not a multiple of WARP
    raster_rows(jobs + (size_t)job * JOB_INTS, group, groups, column, columns, depth_planes,
                width, keys);
}

RS_KERNEL_PER_BLOCK(raster_large, 256,
                    (const int* jobs, const double* depth_planes, int width, rs_u64* keys),
                    (jobs, depth_planes, width, keys))
