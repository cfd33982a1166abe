// Dual-target support: the same kernel source compiles with nvcc for the GPU (pycuda's
// SourceModule) and with g++ as plain C++ for the host emulation the CI tests run
// (render_server/render/cuda/emulation.py).
//
// Every kernel is a body function that takes its work index explicitly, plus an entry point
// made by one of the macros below: on the GPU an `extern "C" __global__` wrapper computes the
// index from blockIdx/threadIdx; on the host an `extern "C"` function loops over the range.
// The kernels use no shared memory, no __syncthreads and no warp intrinsics (except inside
// rs_atomic_inc_u64, whose callers see the same result either way), and their results do not
// depend on the order in which items run (visibility is resolved with a 64-bit atomicMax on a
// key that orders every candidate), so the sequential host loop computes exactly what the GPU
// computes.
//
// Floating point: both targets compile without contraction (nvcc --fmad=false, g++
// -ffp-contract=off); where the CPU renderer's numba code fuses a multiply-add, the kernels
// call fma()/fmaf() explicitly. sqrt, division and conversions are IEEE-rounded on both
// targets, so the GPU frame equals the emulated frame bit for bit.
#pragma once

#ifdef __CUDACC__
#define RS_DEVICE static __device__ __forceinline__
#define RS_NOINLINE static __device__ __noinline__
#define RS_NO_UNROLL _Pragma("unroll 1")
#else
#include <math.h>
#include <string.h>
#define RS_DEVICE static inline
#define RS_NOINLINE static
#define RS_NO_UNROLL
#endif

typedef unsigned long long rs_u64;
typedef long long rs_i64;
typedef unsigned int rs_u32;
typedef unsigned char rs_u8;

// Strips the parentheses of a parameter or argument list passed to the macros below.
#define RS_LIST(...) __VA_ARGS__

// RS_KERNEL_PER_ITEM(name, (params), (args)): `name(int count, params)` runs
// `name_body(item, args)` for item in [0, count); one GPU thread per item.
// RS_KERNEL_PER_BLOCK(name, lanes, (params), (args)): one GPU block per item, its threads
// the lanes: `name_body(item, lane, lanes, args)`. `lanes` is the block size the host
// launches with and the lane count the emulation loops over; the bodies stride by the
// `lanes` they are given, so any block size gives the same result.
#ifdef __CUDACC__
#define RS_KERNEL_PER_ITEM(name, params, args)                                                 \
    extern "C" __global__ void name(int count, RS_LIST params) {                               \
        int item = (int)(blockIdx.x * blockDim.x + threadIdx.x);                               \
        if (item < count) name##_body(item, RS_LIST args);                                     \
    }
#define RS_KERNEL_PER_BLOCK(name, lanes, params, args)                                         \
    extern "C" __global__ void __launch_bounds__(lanes) name(int count, RS_LIST params) {      \
        int item = (int)blockIdx.x;                                                            \
        if (item < count) name##_body(item, (int)threadIdx.x, (int)blockDim.x, RS_LIST args);  \
    }
#else
#define RS_KERNEL_PER_ITEM(name, params, args)                                                 \
    extern "C" void name(int count, RS_LIST params) {                                          \
        for (int item = 0; item < count; ++item) name##_body(item, RS_LIST args);              \
    }
#define RS_KERNEL_PER_BLOCK(name, lanes, params, args)                                         \
    extern "C" void name(int count, RS_LIST params) {                                          \
        for (int item = 0; item < count; ++item)                                               \
            for (int lane = 0; lane < (lanes); ++lane)                                         \
                name##_body(item, lane, (lanes), RS_LIST args);                                \
    }
#endif

// -- atomics: the GPU's, or a plain read-modify-write in the sequential emulation -------------

RS_DEVICE rs_u64 rs_atomic_max_u64(rs_u64* address, rs_u64 value) {
#ifdef __CUDACC__
    return atomicMax(address, value);
#else
    rs_u64 old = *address;
    if (value > old) *address = value;
    return old;
#endif
}

// A unique slot from a counter: the old value of *address, which grows by one per call. On the
// GPU the lanes of a warp that increment the same counter together take one atomic between them
// (a million triangles would otherwise queue a million atomics on one address); which lane gets
// which slot then varies, which no result depends on.
RS_DEVICE rs_u64 rs_atomic_inc_u64(rs_u64* address) {
#ifdef __CUDACC__
    unsigned peers = __match_any_sync(__activemask(), (unsigned long long)address);
    unsigned lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    int leader = __ffs(peers) - 1;
    rs_u64 first = 0;
    if ((int)lane == leader) first = atomicAdd(address, (rs_u64)__popc(peers));
    first = __shfl_sync(peers, first, leader);
    return first + (rs_u64)__popc(peers & ((1u << lane) - 1u));
#else
    return (*address)++;
#endif
}

RS_DEVICE rs_u64 rs_atomic_add_u64(rs_u64* address, rs_u64 value) {
#ifdef __CUDACC__
    return atomicAdd(address, value);
#else
    rs_u64 old = *address;
    *address = old + value;
    return old;
#endif
}

// -- bit casts and small integer helpers -----------------------------------------------------

RS_DEVICE rs_u32 rs_float_bits(float x) {
#ifdef __CUDACC__
    return __float_as_uint(x);
#else
    rs_u32 bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
#endif
}

// Python's // for a positive divisor (C's / truncates toward zero).
RS_DEVICE rs_i64 rs_floor_div(rs_i64 a, rs_i64 b) {
    rs_i64 q = a / b;
    return (q * b != a && a < 0) ? q - 1 : q;
}

RS_DEVICE rs_i64 rs_min64(rs_i64 a, rs_i64 b) { return a < b ? a : b; }
RS_DEVICE rs_i64 rs_max64(rs_i64 a, rs_i64 b) { return a > b ? a : b; }
RS_DEVICE int rs_mini(int a, int b) { return a < b ? a : b; }
RS_DEVICE int rs_maxi(int a, int b) { return a > b ? a : b; }
// numba's min(a, b) / max(a, b) on floats (the comparisons Python's builtins make)
RS_DEVICE float rs_minf(float a, float b) { return b < a ? b : a; }
RS_DEVICE float rs_maxf(float a, float b) { return b > a ? b : a; }
RS_DEVICE double rs_mind(double a, double b) { return b < a ? b : a; }
RS_DEVICE double rs_maxd(double a, double b) { return b > a ? b : a; }

// A float → int conversion that is defined for every input (C leaves NaN and out-of-range
// values undefined): truncation inside [lo, hi], the nearer bound outside, lo for NaN.
RS_DEVICE int rs_trunc_clamp(float x, int lo, int hi) {
    if (!(x >= (float)lo)) return lo;
    if (x >= (float)hi) return hi;
    return (int)x;
}

RS_DEVICE int rs_trunc_clamp_d(double x, int lo, int hi) {
    if (!(x >= (double)lo)) return lo;
    if (x >= (double)hi) return hi;
    return (int)x;
}
