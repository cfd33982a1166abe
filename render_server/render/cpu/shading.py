"""The shading pass: light every pixel once from the triangle the visibility pass left there.

Its cost does not grow with overdraw. Each row is cut into runs of one triangle (or of the
endless floor, or of sky); along a run everything interpolated is affine in the column, so a
run costs one setup, its shadow-map lookups (a 2×2 bilinear PCF), and a lighting loop (sun:
Lambert + GGX; ambient: a sky/ground hemisphere and the environment along the reflection) that
ends in the tone-mapping table. The tables come from `prepare.prepare_scene`, the view rays
from `prepare.view_constants`.

The kernels are written for LLVM's loop vectorizer: hot loops are branch-free, index arrays
with unsigned integers (numba's wrap-around of negative indices turns loads into gathers) and
keep to 32-bit lanes (64-bit lanes need 512-bit registers, which run far slower here).

Numba bakes module globals into its on-disk cache, which is keyed on this file alone: so the
layouts the kernels read (shadow map, tone table) are defined here, and the host code that
builds those tables imports them from here.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

SHADOW_SIZE = 1024
TILE = 8  # the shadow map is stored in 8×8 tiles (4 cache lines) that overlap by one texel,
TILE_STEP = 7  # so a 2×2 footprint never leaves its tile and a walk across the map stays local
COARSE = 32  # texels per side of a block of the coarse shadow map (see shadow_map.coarse)
LANES = 8  # the lighting loop's unit of work: LLVM vectorizes it 8 floats wide
LUT_SIZE = 4096
LUT_MAX = 16.0  # linear radiance at or above this is white

# The kernels take numpy arrays and scalars whose types numba infers at the first call; they
# carry no annotations (hence the no-untyped-def ignores).


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy")
def shade(ids, planes, triangles, material_ids, materials, view, light, shadow_matrix, shadow_tiles, shadow_coarse, lut, row_lo, row_hi, out, row_start, row_stop):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """Shading pass: light every pixel once from its triangle; floor or sky where there is none.

    A row is cut into runs of one triangle (or of floor). Along a run every interpolated
    quantity times 1/w is affine in the column, so a run costs one setup, the shadow-map
    lookups, and a lighting loop that LLVM vectorizes.
    """
    height, width = ids.shape
    f0 = np.float32(0.0)
    f1 = np.float32(1.0)
    top = np.int32(LUT_SIZE - 1)
    zero = np.int32(0)
    scale = np.float32((LUT_SIZE - 1) / math.sqrt(LUT_MAX))
    # LANES of slack: loops run over whole vectors past the end of a run (the next run
    # overwrites the excess), so no pixel falls to a slow scalar remainder loop
    lit = np.zeros(width + LANES, dtype=np.float32)
    out_r = np.zeros(width + LANES, dtype=np.int32)
    out_g = np.zeros(width + LANES, dtype=np.int32)
    out_b = np.zeros(width + LANES, dtype=np.int32)
    tap = np.zeros(width + LANES, dtype=np.int32)
    tap_u = np.zeros(width + LANES, dtype=np.float32)
    tap_v = np.zeros(width + LANES, dtype=np.float32)
    tap_d = np.zeros(width + LANES, dtype=np.float32)
    tap_c = np.zeros(width + LANES, dtype=np.int32)
    lx, ly, lz = light[0], light[1], light[2]
    sun_r, sun_g, sun_b = light[3], light[4], light[5]
    hor_r, hor_g, hor_b = light[6], light[7], light[8]
    zen_r, zen_g, zen_b = light[9], light[10], light[11]  # minus the horizon
    flo_r, flo_g, flo_b = light[12], light[13], light[14]  # minus the horizon
    rxs, rys, rzs = np.float32(view[3]), np.float32(view[4]), np.float32(view[5])
    eye_x, eye_y, eye_z = view[9], view[10], view[11]
    floor_y, floor_offset = view[12], view[13]
    floor_m = materials.shape[0] - 1
    for jj in range(row_start, row_stop):
        j = np.uint64(jj)
        # the camera never rolls, so a ray's height depends on its row alone
        ray_x = view[0] + jj * view[6] + 0.5 * width * view[3]
        ray_y = view[1] + jj * view[7]
        ray_z = view[2] + jj * view[8] + 0.5 * width * view[5]
        length = math.sqrt(ray_x * ray_x + ray_y * ray_y + ray_z * ray_z)
        above = math.sqrt(max(ray_y, 0.0) / length)
        sky_r = _lut_index(hor_r + zen_r * above, scale, top)
        sky_g = _lut_index(hor_g + zen_g * above, scale, top)
        sky_b = _lut_index(hor_b + zen_b * above, scale, top)
        floor_row = ray_y < 0.0 and eye_y > floor_y
        lo = max(row_lo[jj], 0)
        hi = min(row_hi[jj], width - 1)
        if floor_row:
            lo, hi = 0, width - 1
        elif lo > hi:
            lo, hi = width, width - 1
        for k in range(np.uint64(0), np.uint64(lo)):
            out[j, k, 0] = lut[sky_r]
            out[j, k, 1] = lut[sky_g]
            out[j, k, 2] = lut[sky_b]
        for k in range(np.uint64(hi + 1), np.uint64(width)):
            out[j, k, 0] = lut[sky_r]
            out[j, k, 1] = lut[sky_g]
            out[j, k, 2] = lut[sky_b]
        i = lo
        while i <= hi:
            t = ids[j, np.uint64(i)]
            end = i + 1
            while end <= hi and ids[j, np.uint64(end)] == t:
                end += 1
            base = np.uint64(i)
            count = np.uint64(end - i)
            if t < 0 and not floor_row:
                for n in range(count):
                    out_r[base + n] = sky_r
                    out_g[base + n] = sky_g
                    out_b[base + n] = sky_b
                i = end
                continue
            if t < 0:
                # the floor: facing up; the point under column i + n is p + n·dp, moved up by
                # the normal offset for its shadow lookup
                m = floor_m
                nxs, nys, nzs = f0, f0, f0
                nx0, ny0, nz0 = f0, f1, f0
                hit = (floor_y - eye_y) / ray_y
                px = eye_x + hit * (view[0] + i * view[3] + jj * view[6])
                py = floor_y + floor_offset
                pz = eye_z + hit * (view[2] + i * view[5] + jj * view[8])
                dpx, dpz = hit * view[3], hit * view[5]
                s = shadow_matrix
                us = np.float32(s[0, 0] * dpx + s[0, 2] * dpz)
                u0 = np.float32(s[0, 0] * px + s[0, 1] * py + s[0, 2] * pz + s[0, 3])
                vs = np.float32(s[1, 0] * dpx + s[1, 2] * dpz)
                v0 = np.float32(s[1, 0] * px + s[1, 1] * py + s[1, 2] * pz + s[1, 3])
                ds = np.float32(s[2, 0] * dpx + s[2, 2] * dpz)
                d0 = np.float32(s[2, 0] * px + s[2, 1] * py + s[2, 2] * pz + s[2, 3])
                es, e0 = f0, f1
            else:
                m = material_ids[t]
                nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0 = _triangle_terms(
                    t, i, jj, planes, triangles
                )
            _sun_visibility(
                base, count, nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0,
                lx, ly, lz, shadow_tiles, shadow_coarse, lit, tap, tap_u, tap_v, tap_d, tap_c,
            )  # fmt: skip

            sd_r, sd_g, sd_b = materials[m, 0], materials[m, 1], materials[m, 2]
            sf_r, sf_g, sf_b = materials[m, 3], materials[m, 4], materials[m, 5]
            ad_r, ad_g, ad_b = materials[m, 6], materials[m, 7], materials[m, 8]
            au_r, au_g, au_b = materials[m, 9], materials[m, 10], materials[m, 11]
            fe_r, fe_g, fe_b = materials[m, 12], materials[m, 13], materials[m, 14]
            fg_r, fg_g, fg_b = materials[m, 15], materials[m, 16], materials[m, 17]
            alpha2, rough, sharp = materials[m, 18], materials[m, 19], materials[m, 20]
            vx0 = np.float32(view[0] + i * view[3] + jj * view[6])
            vy0 = np.float32(ray_y)
            vz0 = np.float32(view[2] + i * view[5] + jj * view[8])
            # the lighting, branch-free and in whole vectors; fn is a float induction variable
            # because an int64 one would need 512-bit vectors
            padded = (count + np.uint64(LANES - 1)) & ~np.uint64(LANES - 1)
            fn = f0
            for n in range(padded):
                nx = nxs * fn + nx0
                ny = nys * fn + ny0
                nz = nzs * fn + nz0
                rx = vx0 + fn * rxs  # the view ray, from the eye
                ry = vy0 + fn * rys
                rz = vz0 + fn * rzs
                inv_n = f1 / math.sqrt(nx * nx + ny * ny + nz * nz + np.float32(1e-30))
                inv_r = f1 / math.sqrt(rx * rx + ry * ry + rz * rz)
                n_dot_l = (nx * lx + ny * ly + nz * lz) * inv_n
                n_dot_r = (nx * rx + ny * ry + nz * rz) * (inv_n * inv_r)
                r_dot_l = (rx * lx + ry * ly + rz * lz) * inv_r
                # half vector h = l + v with v = −ray: |h|² = 2 − 2 r·l, no vector needed
                h2 = max(np.float32(2.0) - np.float32(2.0) * r_dot_l, np.float32(1e-6))
                inv_h = f1 / math.sqrt(h2)
                n_dot_h = max((n_dot_l - n_dot_r) * inv_h, f0)
                v_dot_h = max((f1 - r_dot_l) * inv_h, f0)
                n_dot_v = max(-n_dot_r, np.float32(1e-3))
                ny = ny * inv_n
                # sun: Lambert + GGX distribution with Kelemen visibility (π folded into the sun)
                den = n_dot_h * n_dot_h * (alpha2 - f1) + f1
                vis = np.float32(0.25) / max(v_dot_h * v_dot_h, np.float32(0.1))
                spec = alpha2 * vis / (den * den)
                f5 = f1 - v_dot_h
                f5 = f5 * f5 * f5 * f5 * f5
                e = max(n_dot_l, f0) * lit[base + n]
                # ambient: a sky/ground hemisphere for diffuse; for specular the environment
                # along the reflection (bent to the normal with roughness), roughness-aware Fresnel
                up = np.float32(0.5) + np.float32(0.5) * ny
                refl_y = np.float32(2.0) * n_dot_v * ny + ry * inv_r
                ey = refl_y + (ny - refl_y) * rough
                env_up = math.sqrt(min(max(ey, f0), f1))
                env_dn = min(max(-ey * sharp, f0), f1)
                g5 = f1 - n_dot_v
                g5 = g5 * g5 * g5 * g5 * g5
                cr = e * (sd_r + spec * (sf_r + (sun_r - sf_r) * f5)) + ad_r + au_r * up
                cg = e * (sd_g + spec * (sf_g + (sun_g - sf_g) * f5)) + ad_g + au_g * up
                cb = e * (sd_b + spec * (sf_b + (sun_b - sf_b) * f5)) + ad_b + au_b * up
                cr += (fe_r + fg_r * g5) * (hor_r + zen_r * env_up + flo_r * env_dn)
                cg += (fe_g + fg_g * g5) * (hor_g + zen_g * env_up + flo_g * env_dn)
                cb += (fe_b + fg_b * g5) * (hor_b + zen_b * env_up + flo_b * env_dn)
                out_r[base + n] = min(max(np.int32(math.sqrt(max(cr, f0)) * scale), zero), top)
                out_g[base + n] = min(max(np.int32(math.sqrt(max(cg, f0)) * scale), zero), top)
                out_b[base + n] = min(max(np.int32(math.sqrt(max(cb, f0)) * scale), zero), top)
                fn += f1
            i = end
        for k in range(np.uint64(lo), np.uint64(hi + 1)):
            out[j, k, 0] = lut[np.uint64(out_r[k])]
            out[j, k, 1] = lut[np.uint64(out_g[k])]
            out[j, k, 2] = lut[np.uint64(out_b[k])]


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy", inline="always")
def _triangle_terms(t, i, jj, planes, triangles):  # type: ignore[no-untyped-def]
    """Affine terms along row jj from column i of triangle t's normal and shadow coordinates.

    Each quantity q times 1/w is qs·n + q0 at column i + n; so is 1/w itself (es, e0).
    """
    # e_k = a_k·n + c_k are the barycentrics times 1/w along this run
    a0, c0 = planes[t, 0], planes[t, 0] * i + planes[t, 1] * jj + planes[t, 2]
    a1, c1 = planes[t, 3], planes[t, 3] * i + planes[t, 4] * jj + planes[t, 5]
    a2, c2 = planes[t, 6], planes[t, 6] * i + planes[t, 7] * jj + planes[t, 8]
    facing = planes[t, 9]  # −1 on the back of a double-sided surface: flip the normal
    q0, q1, q2 = triangles[t, 0], triangles[t, 3], triangles[t, 6]
    nxs = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    nx0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 1], triangles[t, 4], triangles[t, 7]
    nys = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    ny0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 2], triangles[t, 5], triangles[t, 8]
    nzs = np.float32(facing * (a0 * q0 + a1 * q1 + a2 * q2))
    nz0 = np.float32(facing * (c0 * q0 + c1 * q1 + c2 * q2))
    q0, q1, q2 = triangles[t, 9], triangles[t, 12], triangles[t, 15]
    us, u0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    q0, q1, q2 = triangles[t, 10], triangles[t, 13], triangles[t, 16]
    vs, v0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    q0, q1, q2 = triangles[t, 11], triangles[t, 14], triangles[t, 17]
    ds, d0 = np.float32(a0 * q0 + a1 * q1 + a2 * q2), np.float32(c0 * q0 + c1 * q1 + c2 * q2)
    es, e0 = np.float32(a0 + a1 + a2), np.float32(c0 + c1 + c2)
    return nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0


@njit(cache=True, nogil=True, fastmath=True, error_model="numpy", inline="always")
def _sun_visibility(base, count, nxs, nx0, nys, ny0, nzs, nz0, us, u0, vs, v0, ds, d0, es, e0, lx, ly, lz, shadow_tiles, shadow_coarse, lit, tap, tap_u, tap_v, tap_d, tap_c):  # type: ignore[no-untyped-def]  # noqa: E501  # fmt: skip
    """lit[base + n] for n < count: the 2×2 bilinear PCF of the shadow map (0 in shadow).

    Texel addresses and weights are computed for whole vectors first (this vectorizes), then
    the lookups go one by one, since gathers are what LLVM will not emit here.
    """
    f0 = np.float32(0.0)
    f1 = np.float32(1.0)
    tile = np.float32(TILE)
    step = np.float32(TILE_STEP)
    inv_step = np.float32(1.0 / TILE_STEP)
    tiles = np.float32((SHADOW_SIZE - 2) // TILE_STEP + 1)  # per side
    texel_max = np.float32(SHADOW_SIZE - 2)  # the 2×2 footprint starts at most here
    zero = np.int32(0)
    last_tap = np.int32(shadow_tiles.shape[0] - TILE - 2)
    last_block = np.int32(shadow_coarse.shape[0] - 1)
    blocks = np.float32(-(-SHADOW_SIZE // COARSE))
    inv_coarse = np.float32(1.0 / COARSE)
    away = np.float32(-3.0e38)  # a depth every occluder beats: no light
    padded = (count + np.uint64(LANES - 1)) & ~np.uint64(LANES - 1)
    fn = f0
    for n in range(padded):
        inv = f1 / (es * fn + e0)
        su = (us * fn + u0) * inv - np.float32(0.5)
        sv = (vs * fn + v0) * inv - np.float32(0.5)
        fu = np.floor(su)
        fv = np.floor(sv)
        # texel and tile arithmetic in float32: exact below 2**24, and 32-bit lanes
        iu = min(max(fu, f0), texel_max)
        iv = min(max(fv, f0), texel_max)
        tu = np.floor((iu + np.float32(0.5)) * inv_step)
        tv = np.floor((iv + np.float32(0.5)) * inv_step)
        index = ((tv * tiles + tu) * tile + iv - tv * step) * tile + iu - tu * step
        # clamped as integers too: a degenerate triangle's NaN must not become an address
        tap[base + n] = min(max(np.int32(index), zero), last_tap)
        coarse = np.int32(np.floor(iv * inv_coarse) * blocks + np.floor(iu * inv_coarse))
        tap_c[base + n] = min(max(coarse, zero), last_block)
        tap_u[base + n] = su - fu
        tap_v[base + n] = sv - fv
        toward_sun = (nxs * fn + nx0) * lx + (nys * fn + ny0) * ly + (nzs * fn + nz0) * lz
        tap_d[base + n] = (ds * fn + d0) * inv if toward_sun > f0 else away
        fn += f1
    for n in range(count):
        k = base + n
        d = tap_d[k]
        if d == away:
            lit[k] = f0
            continue
        if d >= shadow_coarse[np.uint64(tap_c[k])]:
            lit[k] = f1  # nearer the sun than anything in this block
            continue
        x = np.uint64(tap[k])
        l00 = f1 if d >= shadow_tiles[x] else f0
        l10 = f1 if d >= shadow_tiles[x + np.uint64(1)] else f0
        l01 = f1 if d >= shadow_tiles[x + np.uint64(TILE)] else f0
        l11 = f1 if d >= shadow_tiles[x + np.uint64(TILE + 1)] else f0
        top_row = l00 + (l10 - l00) * tap_u[k]
        lit[k] = top_row + (l01 + (l11 - l01) * tap_u[k] - top_row) * tap_v[k]


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _lut_index(x, scale, top):  # type: ignore[no-untyped-def]
    """Index of linear radiance x in the tone-mapping table (indexed by the square root)."""
    return np.int32(min(max(np.int64(math.sqrt(max(x, 0.0)) * scale), 0), top))
