// RGB → 4:2:0 for the encoder: render_server/encode/convert.py's `_rgb_to_yuv420`, the same
// integer BT.709 limited-range formulas, so the GPU's planes equal the CPU conversion's bit
// for bit. One thread per 2×2 block; even frame sides.
//
// The output is one contiguous buffer laid out as PyAV's `VideoFrame.from_numpy_buffer`
// expects a (height·3/2, width) array: the Y plane (width bytes a row), then either the
// interleaved UV plane (NV12, width bytes a row) or the U and the V planes (yuv420p, width/2
// bytes a row each). NV12 rows may be `pitch` ≥ width bytes apart instead (the UV plane then
// starts pitch·height bytes in): the layout NVENC reads from a CUDA frame, whose row pitch
// FFmpeg aligns to 256 bytes.
#include "common.cuh"

// Y of the four pixels of block (bx, by) into `y` (rows `pitch` bytes apart); the block's sums
// of R, G and B into sums.
RS_DEVICE void luma_block(const rs_u8* rgb, int width, int pitch, int bx, int by, rs_u8* y,
                          int* sums) {
    int rs = 0, gs = 0, bs = 0;
    for (int dy = 0; dy < 2; ++dy) {
        size_t row = (size_t)(2 * by + dy) * (size_t)width;
        size_t out_row = (size_t)(2 * by + dy) * (size_t)pitch;
        for (int dx = 0; dx < 2; ++dx) {
            size_t p = row + (size_t)(2 * bx + dx);
            int r = rgb[p * 3 + 0], g = rgb[p * 3 + 1], b = rgb[p * 3 + 2];
            y[out_row + (size_t)(2 * bx + dx)] =
                (rs_u8)((47 * r + 157 * g + 16 * b + 128 + (16 << 8)) >> 8);
            rs += r;
            gs += g;
            bs += b;
        }
    }
    sums[0] = rs;
    sums[1] = gs;
    sums[2] = bs;
}

RS_DEVICE rs_u8 chroma_u(const int* s) {
    return (rs_u8)((-26 * s[0] - 87 * s[1] + 112 * s[2] + 512 + (128 << 10)) >> 10);
}

RS_DEVICE rs_u8 chroma_v(const int* s) {
    return (rs_u8)((112 * s[0] - 102 * s[1] - 10 * s[2] + 512 + (128 << 10)) >> 10);
}

RS_DEVICE void rgb_to_nv12_body(int block, const rs_u8* rgb, int width, int height, int pitch,
                                rs_u8* out) {
    int half_width = width / 2;
    int by = block / half_width, bx = block - by * half_width;
    int sums[3];
    luma_block(rgb, width, pitch, bx, by, out, sums);
    rs_u8* uv = out + (size_t)pitch * (size_t)height + (size_t)by * (size_t)pitch + 2 * bx;
    uv[0] = chroma_u(sums);
    uv[1] = chroma_v(sums);
}

RS_KERNEL_PER_ITEM(rgb_to_nv12, (const rs_u8* rgb, int width, int height, int pitch, rs_u8* out),
                   (rgb, width, height, pitch, out))

RS_DEVICE void rgb_to_yuv420p_body(int block, const rs_u8* rgb, int width, int height,
                                   rs_u8* out) {
    int half_width = width / 2;
    int by = block / half_width, bx = block - by * half_width;
    int sums[3];
    luma_block(rgb, width, width, bx, by, out, sums);
    size_t luma = (size_t)width * (size_t)height;
    size_t at = (size_t)by * (size_t)half_width + (size_t)bx;
    out[luma + at] = chroma_u(sums);
    out[luma + luma / 4 + at] = chroma_v(sums);
}

RS_KERNEL_PER_ITEM(rgb_to_yuv420p, (const rs_u8* rgb, int width, int height, rs_u8* out),
                   (rgb, width, height, out))
