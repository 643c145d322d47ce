/* The 8-float vectors and helpers attention.c and layer.c share (see attention.c's header for
 * why 8 floats). Every operation rounds as written: both files build with -ffp-contract=off. */
#ifndef DW_SIMD_H
#define DW_SIMD_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));
typedef uint32_t u8x32 __attribute__((vector_size(32)));
typedef uint16_t h8 __attribute__((vector_size(16)));

static inline v8 load8(const float *p) { v8 r; memcpy(&r, p, sizeof r); return r; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }
static inline v8 load_bf8(const uint16_t *p) {
    h8 h; memcpy(&h, p, sizeof h);
    u8x32 w = __builtin_convertvector(h, u8x32) << 16;
    v8 r; memcpy(&r, &w, sizeof r); return r;
}
static inline v8 load_kv8(const void *base, int64_t off, int bf16) {
    return bf16 ? load_bf8((const uint16_t *)base + off) : load8((const float *)base + off);
}
static inline v8 splat8(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 vmax8(v8 a, v8 b) {
    i8 m = a > b;
    return (v8)(((i8)a & m) | ((i8)b & ~m));
}

/* exp(x) for x <= 0 (Cephes' expf: x = n ln2 + r, a degree-7 polynomial in r); exactly 0 below -87. */
static inline v8 vexp8(v8 x) {
    v8 lo = splat8(-87.0f);
    i8 under = x < lo;
    x = vmax8(x, lo);
    v8 t = x * splat8(1.44269504088896341f) + splat8(12582912.0f);
    v8 n = t - splat8(12582912.0f); /* round to nearest */
    v8 r = x - n * splat8(0.693359375f) - n * splat8(-2.12194440e-4f);
    v8 p = splat8(1.9875691500e-4f);
    p = p * r + splat8(1.3981999507e-3f);
    p = p * r + splat8(8.3334519073e-3f);
    p = p * r + splat8(4.1665795894e-2f);
    p = p * r + splat8(1.6666665459e-1f);
    p = p * r + splat8(5.0000001201e-1f);
    p = p * (r * r) + r + splat8(1.0f);
    i8 bits = (__builtin_convertvector(n, i8) + 127) << 23;
    v8 scale; memcpy(&scale, &bits, sizeof scale);
    return (v8)((i8)(p * scale) & ~under);
}

/* Eight floats rounded to bfloat16 (to nearest, ties to even; a NaN stays a quiet NaN), as
 * their 32-bit patterns with the low 16 bits zero. */
static inline u8x32 bf_bits8(v8 f) {
    u8x32 u;
    memcpy(&u, &f, sizeof u);
    const u8x32 nan = (u & 0x7fffffffu) > 0x7f800000u;
    const u8x32 r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (r & ~nan) | ((u | 0x00400000u) & 0xffff0000u & nan);
}

/* This thread's scratch floats, at least n of them (grown, never shrunk; NULL when memory ran
 * out). One buffer per thread and per file that includes this header. */
static __thread float *buffer;
static __thread size_t capacity;

static inline float *scratch(size_t n) {
    if (n > capacity) {
        free(buffer);
        capacity = n + n / 2;
        buffer = (float *)malloc(capacity * sizeof(float));
        if (!buffer) capacity = 0;
    }
    return buffer;
}

#endif
