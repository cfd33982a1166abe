// Shading: the CPU renderer's `shade` (render_server/render/cpu/shading.py), one thread per
// pixel.
//
// Each pixel is lit once from the triangle its visibility key names: perspective-correct
// barycentrics from the triangle's planes, the corner normals and shadow-map coordinates
// interpolated with them, 2×2 PCF through the tiled and the coarse shadow map, GGX sun plus
// hemisphere and environment ambient, and the ACES-fit tone map through the sqrt-indexed
// LUT. Pixels without a triangle see the endless floor (below the horizon, camera above the
// floor) or the sky gradient.
//
// The CPU steps the interpolated terms along runs of one triangle in float32; here they are
// evaluated at the pixel itself, the same value up to float32 rounding. The float64 parts
// (rays, barycentric planes, floor hits) stay float64 as on the CPU: about 40 float64
// operations a pixel, a few microseconds per 4K frame on an H100/H200 but around half a
// millisecond on a consumer GPU, whose float64 rate is 1/64 of its float32 rate.
#include "common.cuh"

#ifndef SHADOW_SIZE
#define SHADOW_SIZE 1024  // shading.SHADOW_SIZE
#endif
#ifndef TILE
#define TILE 8  // shading.TILE
#endif
#ifndef TILE_STEP
#define TILE_STEP 7  // shading.TILE_STEP
#endif
#ifndef COARSE
#define COARSE 32  // shading.COARSE
#endif
#ifndef LUT_SIZE
#define LUT_SIZE 4096  // shading.LUT_SIZE
#endif
#ifndef LUT_MAX
#define LUT_MAX 16.0  // shading.LUT_MAX
#endif

#ifndef PLANE_WIDTH
#define PLANE_WIDTH 10  // raster.PLANE_WIDTH: the planes of raster.visibility
#endif
#ifndef TRIANGLE_WIDTH
#define TRIANGLE_WIDTH 18  // prepare.TRIANGLE_WIDTH: corner normals, shadow u, v, depth
#endif
#ifndef MATERIAL_WIDTH
#define MATERIAL_WIDTH 21  // lighting.MATERIAL_WIDTH
#endif

#define VIEW_OFFSET 16     // frame[16:30]: prepare.view_constants() (rays, eye, floor y, offset)

// Index of linear radiance x (float64) in the tone-mapping LUT: shading._lut_index.
RS_DEVICE int lut_index_d(double x, float scale, int top) {
    return rs_trunc_clamp_d(sqrt(rs_maxd(x, 0.0)) * (double)scale, 0, top);
}

// Index of linear radiance x (float32) in the LUT, as the CPU's lighting loop computes it.
RS_DEVICE int lut_index_f(float x, float scale, int top) {
    return rs_trunc_clamp(sqrtf(rs_maxf(x, 0.0f)) * scale, 0, top);
}

// shading._sun_visibility at one point: 2×2 bilinear PCF of the shadow map (0 in shadow).
// (u, v, d) are the shadow coordinates times 1/w, e is 1/w, n the normal times 1/w.
RS_DEVICE float sun_visibility(float u, float v, float d, float e, float nx, float ny, float nz,
                               float lx, float ly, float lz, const float* shadow_tiles,
                               int last_tap, const float* shadow_coarse, int last_block) {
    const float tile = (float)TILE;
    const float step = (float)TILE_STEP;
    const float inv_step = (float)(1.0 / TILE_STEP);
    const float tiles = (float)((SHADOW_SIZE - 2) / TILE_STEP + 1);
    const float texel_max = (float)(SHADOW_SIZE - 2);
    const float blocks = (float)((SHADOW_SIZE + COARSE - 1) / COARSE);
    const float inv_coarse = (float)(1.0 / COARSE);
    float inv = 1.0f / e;
    float su = u * inv - 0.5f;
    float sv = v * inv - 0.5f;
    float fu = floorf(su);
    float fv = floorf(sv);
    float iu = rs_minf(rs_maxf(fu, 0.0f), texel_max);
    float iv = rs_minf(rs_maxf(fv, 0.0f), texel_max);
    float tu = floorf((iu + 0.5f) * inv_step);
    float tv = floorf((iv + 0.5f) * inv_step);
    float index = ((tv * tiles + tu) * tile + iv - tv * step) * tile + iu - tu * step;
    int tap = rs_trunc_clamp(index, 0, last_tap);
    int coarse = rs_trunc_clamp(floorf(iv * inv_coarse) * blocks + floorf(iu * inv_coarse), 0,
                                last_block);
    float toward_sun = nx * lx + ny * ly + nz * lz;
    if (!(toward_sun > 0.0f)) return 0.0f;  // facing away from the sun
    float depth = d * inv;
    if (depth >= shadow_coarse[coarse]) return 1.0f;  // nearer the sun than all of the block
    float tap_u = su - fu;
    float tap_v = sv - fv;
    float l00 = depth >= shadow_tiles[tap] ? 1.0f : 0.0f;
    float l10 = depth >= shadow_tiles[tap + 1] ? 1.0f : 0.0f;
    float l01 = depth >= shadow_tiles[tap + TILE] ? 1.0f : 0.0f;
    float l11 = depth >= shadow_tiles[tap + TILE + 1] ? 1.0f : 0.0f;
    float top_row = l00 + (l10 - l00) * tap_u;
    return top_row + (l01 + (l11 - l01) * tap_u - top_row) * tap_v;
}

RS_DEVICE void shade_body(int pixel, const rs_u64* keys, const double* planes,
                          const float* triangles, const int* material_ids,
                          const float* materials, int floor_material, const double* frame,
                          const float* light, const double* shadow_matrix,
                          const float* shadow_tiles, int last_tap, const float* shadow_coarse,
                          int last_block, const rs_u8* lut, int width, rs_u8* out) {
    const double* view = frame + VIEW_OFFSET;
    const float scale = (float)((LUT_SIZE - 1) / sqrt(LUT_MAX));
    const int top = LUT_SIZE - 1;
    int jj = pixel / width;
    int i = pixel - jj * width;
    rs_u8* rgb = out + (size_t)pixel * 3;
    float lx = light[0], ly = light[1], lz = light[2];
    float hor_r = light[6], hor_g = light[7], hor_b = light[8];
    float zen_r = light[9], zen_g = light[10], zen_b = light[11];  // minus the horizon
    float flo_r = light[12], flo_g = light[13], flo_b = light[14];  // minus the horizon
    double eye_x = view[9], eye_y = view[10], eye_z = view[11];
    double floor_y = view[12], floor_offset = view[13];

    // the camera never rolls, so a ray's height depends on its row alone
    double ray_y = view[1] + jj * view[7];
    rs_u64 key = keys[pixel];
    bool floor_row = ray_y < 0.0 && eye_y > floor_y;
    if (key == 0ULL && !floor_row) {  // the sky
        double ray_x = view[0] + jj * view[6] + 0.5 * width * view[3];
        double ray_z = view[2] + jj * view[8] + 0.5 * width * view[5];
        double length = sqrt(ray_x * ray_x + ray_y * ray_y + ray_z * ray_z);
        double above = sqrt(rs_maxd(ray_y, 0.0) / length);
        rgb[0] = lut[lut_index_d(hor_r + zen_r * above, scale, top)];
        rgb[1] = lut[lut_index_d(hor_g + zen_g * above, scale, top)];
        rgb[2] = lut[lut_index_d(hor_b + zen_b * above, scale, top)];
        return;
    }

    int m;
    float nx, ny, nz, u, v, d, e;
    if (key == 0ULL) {
        // the floor, facing up; its shadow lookup point moved up by the normal offset
        m = floor_material;
        nx = 0.0f;
        ny = 1.0f;
        nz = 0.0f;
        double hit = (floor_y - eye_y) / ray_y;
        double px = eye_x + hit * (view[0] + i * view[3] + jj * view[6]);
        double py = floor_y + floor_offset;
        double pz = eye_z + hit * (view[2] + i * view[5] + jj * view[8]);
        const double* s = shadow_matrix;
        u = (float)(s[0] * px + s[1] * py + s[2] * pz + s[3]);
        v = (float)(s[4] * px + s[5] * py + s[6] * pz + s[7]);
        d = (float)(s[8] * px + s[9] * py + s[10] * pz + s[11]);
        e = 1.0f;
    } else {
        int t = (int)(0xFFFFFFFFu - (rs_u32)(key & 0xFFFFFFFFull));
        m = material_ids[t];
        // e_k: the barycentrics times 1/w at this pixel (shading._triangle_terms)
        const double* p = planes + (size_t)t * PLANE_WIDTH;
        double c0 = p[0] * i + p[1] * jj + p[2];
        double c1 = p[3] * i + p[4] * jj + p[5];
        double c2 = p[6] * i + p[7] * jj + p[8];
        double facing = p[9];  // −1 on the back of a double-sided surface: flip the normal
        const float* q = triangles + (size_t)t * TRIANGLE_WIDTH;
        nx = (float)(facing * (c0 * q[0] + c1 * q[3] + c2 * q[6]));
        ny = (float)(facing * (c0 * q[1] + c1 * q[4] + c2 * q[7]));
        nz = (float)(facing * (c0 * q[2] + c1 * q[5] + c2 * q[8]));
        u = (float)(c0 * q[9] + c1 * q[12] + c2 * q[15]);
        v = (float)(c0 * q[10] + c1 * q[13] + c2 * q[16]);
        d = (float)(c0 * q[11] + c1 * q[14] + c2 * q[17]);
        e = (float)(c0 + c1 + c2);
    }
    float lit = sun_visibility(u, v, d, e, nx, ny, nz, lx, ly, lz, shadow_tiles, last_tap,
                               shadow_coarse, last_block);

    const float* mat = materials + (size_t)m * MATERIAL_WIDTH;
    float sd_r = mat[0], sd_g = mat[1], sd_b = mat[2];
    float sf_r = mat[3], sf_g = mat[4], sf_b = mat[5];
    float ad_r = mat[6], ad_g = mat[7], ad_b = mat[8];
    float au_r = mat[9], au_g = mat[10], au_b = mat[11];
    float fe_r = mat[12], fe_g = mat[13], fe_b = mat[14];
    float fg_r = mat[15], fg_g = mat[16], fg_b = mat[17];
    float alpha2 = mat[18], rough = mat[19], sharp = mat[20];
    float sun_r = light[3], sun_g = light[4], sun_b = light[5];

    // the view ray, from the eye
    float rx = (float)(view[0] + i * view[3] + jj * view[6]);
    float ry = (float)ray_y;
    float rz = (float)(view[2] + i * view[5] + jj * view[8]);
    float inv_n = 1.0f / sqrtf(nx * nx + ny * ny + nz * nz + 1e-30f);
    float inv_r = 1.0f / sqrtf(rx * rx + ry * ry + rz * rz);
    float n_dot_l = (nx * lx + ny * ly + nz * lz) * inv_n;
    float n_dot_r = (nx * rx + ny * ry + nz * rz) * (inv_n * inv_r);
    float r_dot_l = (rx * lx + ry * ly + rz * lz) * inv_r;
    // half vector h = l + v with v = −ray: |h|² = 2 − 2 r·l
    float h2 = rs_maxf(2.0f - 2.0f * r_dot_l, 1e-6f);
    float inv_h = 1.0f / sqrtf(h2);
    float n_dot_h = rs_maxf((n_dot_l - n_dot_r) * inv_h, 0.0f);
    float v_dot_h = rs_maxf((1.0f - r_dot_l) * inv_h, 0.0f);
    float n_dot_v = rs_maxf(-n_dot_r, 1e-3f);
    float up_n = ny * inv_n;
    // sun: Lambert + GGX distribution with Kelemen visibility (π folded into the sun)
    float den = n_dot_h * n_dot_h * (alpha2 - 1.0f) + 1.0f;
    float vis = 0.25f / rs_maxf(v_dot_h * v_dot_h, 0.1f);
    float spec = alpha2 * vis / (den * den);
    float f5 = 1.0f - v_dot_h;
    f5 = f5 * f5 * f5 * f5 * f5;
    float sun = rs_maxf(n_dot_l, 0.0f) * lit;
    // ambient: a sky/ground hemisphere for diffuse; for specular the environment along the
    // reflection (bent to the normal with roughness), with roughness-aware Fresnel
    float up = 0.5f + 0.5f * up_n;
    float refl_y = 2.0f * n_dot_v * up_n + ry * inv_r;
    float ey = refl_y + (up_n - refl_y) * rough;
    float env_up = sqrtf(rs_minf(rs_maxf(ey, 0.0f), 1.0f));
    float env_dn = rs_minf(rs_maxf(-ey * sharp, 0.0f), 1.0f);
    float g5 = 1.0f - n_dot_v;
    g5 = g5 * g5 * g5 * g5 * g5;
    float cr = sun * (sd_r + spec * (sf_r + (sun_r - sf_r) * f5)) + ad_r + au_r * up;
    float cg = sun * (sd_g + spec * (sf_g + (sun_g - sf_g) * f5)) + ad_g + au_g * up;
    float cb = sun * (sd_b + spec * (sf_b + (sun_b - sf_b) * f5)) + ad_b + au_b * up;
    cr += (fe_r + fg_r * g5) * (hor_r + zen_r * env_up + flo_r * env_dn);
    cg += (fe_g + fg_g * g5) * (hor_g + zen_g * env_up + flo_g * env_dn);
    cb += (fe_b + fg_b * g5) * (hor_b + zen_b * env_up + flo_b * env_dn);
    rgb[0] = lut[lut_index_f(cr, scale, top)];
    rgb[1] = lut[lut_index_f(cg, scale, top)];
    rgb[2] = lut[lut_index_f(cb, scale, top)];
}

RS_KERNEL_PER_ITEM(shade,
                   (const rs_u64* keys, const double* planes, const float* triangles,
                    const int* material_ids, const float* materials, int floor_material,
                    const double* frame, const float* light, const double* shadow_matrix,
                    const float* shadow_tiles, int last_tap, const float* shadow_coarse,
                    int last_block, const rs_u8* lut, int width, rs_u8* out),
                   (keys, planes, triangles, material_ids, materials, floor_material, frame,
                    light, shadow_matrix, shadow_tiles, last_tap, shadow_coarse, last_block,
                    lut, width, out))
