/* The element-wise work between a decoder layer's matmuls, in one call each (built with
 * attention.c into one library; see draftwise.runtime.kernels).
 *
 * Why: on a CPU the four matmuls of a layer stream megabytes of weights, which evicts what the
 * interpreter and torch's dispatcher had in cache; the first few small torch operations after each
 * matmul then cost 40-90 us apiece instead of 2-15 us (measured on a 2-core Xeon: an rms_norm of
 * one 576-wide row, 92 us right after a matmul, 17 us run again; a ctypes call, 17 us). The
 * default model's decode step ran about 25 such operations a layer: 26% of a float32 step and
 * 35% of a bfloat16 one at one sequence. Here each gap between two matmuls is one call:
 *
 *   dw_rope_store   q, k rotated; k and v written into the cache at each row's slot and position;
 *                   the rotated queries out in float32 for dw_attend
 *   dw_add_norm     x += y (the residual, in place), then h = rms_norm(x) * w; or only one of the two
 *   dw_silu_mul     silu(gate) * up
 *
 * Row invariance: every row is computed by one thread with arithmetic fixed by this code alone
 * (the rms_norm's sum of squares in 16 lanes, lane i mod 16 in order over i, the lanes added in a
 * fixed tree), so what a row gets never depends on the other rows of its pass. No -ffast-math
 * and no contraction into FMA (-ffp-contract=off): each operation rounds as written.
 *
 * Element types: float32, or bfloat16 (flag `bf16`): a bfloat16 model's values are read into
 * float32, computed there, and rounded to bfloat16 (to nearest, ties to even) where torch would
 * store a bfloat16 tensor: after the normalisation and after the weight, after x * cos and after
 * the rotation's sum, after silu and after the product, after the residual add.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

/* f rounded to the element type (bfloat16: the nearest bfloat16, kept as floats) */
static inline v8 rnd8(v8 f, int bf16) {
    if (!bf16) return f;
    u8x32 b = bf_bits8(f);
    v8 r;
    memcpy(&r, &b, sizeof r);
    return r;
}
static inline void put8(void *p, int64_t i, v8 f, int bf16) {
    if (bf16) {
        h8 h = __builtin_convertvector(bf_bits8(f) >> 16, h8);
        memcpy((uint16_t *)p + i, &h, sizeof h);
    } else {
        store8((float *)p + i, f);
    }
}
/* one float: the same as lane 0 of the vector forms */
static inline float rnd1(float f, int bf16) { return rnd8(splat8(f), bf16)[0]; }
static inline float get1(const void *p, int64_t i, int bf16) {
    if (!bf16) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline void put1(void *p, int64_t i, float f, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = (uint16_t)(bf_bits8(splat8(f))[0] >> 16);
    else ((float *)p)[i] = f;
}

/* sum_i x_i^2 over one row: 16 lanes (lane i mod 16, in order over i), added in a fixed tree */
static float sum_squares(const float *x, int64_t d) {
    float lane[16];
    v8 lo = splat8(0.0f), hi = splat8(0.0f);
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
        v8 a = load8(x + i), b = load8(x + i + 8);
        lo = lo + a * a;
        hi = hi + b * b;
    }
    for (int l = 0; l < 8; l++) lane[l] = lo[l], lane[l + 8] = hi[l];
    for (; i < d; i++) lane[i & 15] = lane[i & 15] + x[i] * x[i];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] = lane[l] + lane[l + w];
    return lane[0];
}

/* Rows of x ([rows, d], row stride d): x += y where y is given (the sum rounded to the element
 * type); then, where w is given, out = rms_norm(x) * w ([rows, d]): x / sqrt(mean(x^2) + eps)
 * rounded, times w rounded. Returns 1 when memory ran out. */
int dw_add_norm(void *x, const void *y, const void *w, void *out, int64_t rows, int64_t d, float eps, int bf16,
                int threads) {
    int failed = 0;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * d >= 65536) reduction(| : failed)
    for (int64_t r = 0; r < rows; r++) {
        float *v = scratch((size_t)d);
        if (!v) {
            failed = 1;
            continue;
        }
        const int64_t o = r * d;
        int64_t i = 0;
        for (; i + 8 <= d; i += 8) {
            v8 a = load_kv8(x, o + i, bf16);
            if (y) {
                a = rnd8(a + load_kv8(y, o + i, bf16), bf16);
                put8(x, o + i, a, bf16);
            }
            store8(v + i, a);
        }
        for (; i < d; i++) {
            float a = get1(x, o + i, bf16);
            if (y) {
                a = rnd1(a + get1(y, o + i, bf16), bf16);
                put1(x, o + i, a, bf16);
            }
            v[i] = a;
        }
        if (!w) continue;
        const float inv = 1.0f / sqrtf(sum_squares(v, d) / (float)d + eps);
        const v8 iv = splat8(inv);
        for (i = 0; i + 8 <= d; i += 8)
            put8(out, o + i, rnd8(load_kv8(w, i, bf16) * rnd8(load8(v + i) * iv, bf16), bf16), bf16);
        for (; i < d; i++) put1(out, o + i, rnd1(get1(w, i, bf16) * rnd1(v[i] * inv, bf16), bf16), bf16);
    }
    return failed;
}

/* silu(g) * u for eight lanes: g * sigmoid(g), the sigmoid from e = exp(-|g|) (1 / (1 + e) for
 * g >= 0, e / (1 + e) below), silu rounded, then the product rounded */
static inline v8 silu_mul8(v8 g, v8 u, int bf16) {
    const i8 neg = g < splat8(0.0f);
    const v8 e = vexp8((v8)((i8)g | (i8)splat8(-0.0f))); /* exp(-|g|): the sign bit set */
    const v8 one = splat8(1.0f), den = one + e;
    const v8 sig = (v8)(((i8)e & neg) | ((i8)one & ~neg)) / den; /* e / (1 + e) or 1 / (1 + e) */
    return rnd8(rnd8(g * sig, bf16) * u, bf16);
}

/* out = silu(gate) * up, gate = gu[:, :f], up = gu[:, f:] ([rows, 2 f] -> [rows, f]) */
void dw_silu_mul(const void *gu, void *out, int64_t rows, int64_t f, int bf16, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * f >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t g0 = r * 2 * f, u0 = g0 + f, o = r * f;
        int64_t i = 0;
        for (; i + 8 <= f; i += 8)
            put8(out, o + i, silu_mul8(load_kv8(gu, g0 + i, bf16), load_kv8(gu, u0 + i, bf16), bf16), bf16);
        for (; i < f; i++)
            put1(out, o + i, silu_mul8(splat8(get1(gu, g0 + i, bf16)), splat8(get1(gu, u0 + i, bf16)), bf16)[0], bf16);
    }
}

/* One pass's q/k/v rows (qkv [rows, (H + 2 KV) hd], row stride `qkv_row`): q and k rotated at
 * each row's rotary position (`positions`; tables cos and sin_signed [positions, hd]), q written
 * as float32 to q_out ([rows, H, hd]), k and v stored into the caches ([slots, KV, ctx, hd],
 * strides c_slot, c_head, c_pos) at each row's slot (`slot_of`) and position (`at`). The
 * rotation: x cos + roll(x, hd / 2) sin_signed, with x cos rounded first, then the sum. hd is a
 * multiple of 16 (dw_attend's head sizes). */
void dw_rope_store(const void *qkv, int64_t qkv_row, const void *cos, const void *sin, const int64_t *positions,
                   const int64_t *slot_of, const int64_t *at, float *q_out, void *k_cache, void *v_cache,
                   int64_t c_slot, int64_t c_head, int64_t c_pos, int64_t rows, int H, int KV, int hd, int bf16,
                   int threads) {
    const int half = hd / 2;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= 64)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t src = r * qkv_row, tab = positions[r] * hd;
        const int64_t cache = slot_of[r] * c_slot + at[r] * c_pos;
        for (int j = 0; j < H + KV; j++) {
            const int64_t base = src + (int64_t)j * hd;
            for (int t = 0; t < hd; t += 8) {
                const int from = t < half ? t + half : t - half;
                const v8 x = load_kv8(qkv, base + t, bf16), rolled = load_kv8(qkv, base + from, bf16);
                const v8 a = rnd8(x * load_kv8(cos, tab + t, bf16), bf16);
                const v8 val = rnd8(a + rolled * load_kv8(sin, tab + t, bf16), bf16);
                if (j < H) store8(q_out + (r * H + j) * hd + t, val);
                else put8(k_cache, cache + (int64_t)(j - H) * c_head + t, val, bf16);
            }
        }
        for (int j = 0; j < KV; j++) {
            const int64_t base = src + (int64_t)(H + KV + j) * hd, dst = cache + (int64_t)j * c_head;
            if (bf16) memcpy((uint16_t *)v_cache + dst, (const uint16_t *)qkv + base, (size_t)hd * 2);
            else memcpy((float *)v_cache + dst, (const float *)qkv + base, (size_t)hd * 4);
        }
    }
}
