/* Row-invariant attention for a ragged batch of sequences, in one call per layer.
 *
 * Built at first use by draftwise.runtime.kernels (cc -O3 -march=native -fopenmp
 * -ffp-contract=off). Every query row is computed by one thread, with arithmetic fixed by this
 * code alone: what a row gets depends on its own query, its own sequence's keys and values and
 * which of them it sees, never on the other rows of the pass, their number, or how the work is
 * split between threads.
 *
 *   score_j = scale * sum_d q_d k_jd    the sum over d in 16 lanes (one lane per d mod 16, in
 *                                       order over d), the lanes added in a fixed tree
 *   e_j     = exp(score_j - max)        a fixed polynomial; 0 where the row does not see key j
 *   out     = (sum_j e_j v_j) / sum_j e_j   over j in order from 0; the denominator in 16 lanes
 *                                       (lane j mod 16, j counting only the keys the row sees)
 *                                       added in the same fixed tree
 *
 * A row sees keys 0 .. start + j of its sequence (row j of a chain), or, for a tree pass, keys
 * before `start` and its own ancestors-or-self among the pass's rows. A key it does not see adds
 * exactly 0 to the values, so running further over masked keys cannot change a bit, and a tree
 * row's denominator counts lanes over the keys it sees: it gets its path's chain's bits.
 *
 * The 16 lanes are held as two 8-float halves (lanes 0-7 and 8-15), so that a block of rows
 * fits the sixteen 256-bit registers of AVX2: written with 16-float vectors, GCC split every
 * one in two and the block's accumulators did not fit (most likely spilled), and attention
 * cost 2.3x (one row) to 3x (two rows) what it does now at 1,024 keys (docs/runtime.md).
 * Neither the lanes' layout nor the grouping of rows into blocks changes a row's arithmetic.
 *
 * No -ffast-math, and no contraction of a multiply and an add into one FMA (-ffp-contract=off):
 * every operation rounds as written, whatever the compiler and the CPU, so a row's bits depend
 * on this code alone (tests/test_row_invariance.py checks them).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"

#define QB 4         /* query rows per register block */
#define ITEM_ROWS 32 /* query rows per unit of work handed to a thread */
#define MAX_NC 8     /* head_dim up to 128: 16-lane groups of d */

/* The sums of four 16-lane vectors, one fixed tree for all four: lane l + 8 onto lane l (the
 * caller adds the two halves: x[l] + x[l + 8] in lane l of its argument), then l + 4, then
 * l + 2, then l + 1. The four sums come in lanes 0, 2, 4 and 6. */
static inline v8 sum4h(v8 a, v8 b, v8 c, v8 d) {
    v8 ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
    v8 cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 8, 9, 10, 11) + __builtin_shufflevector(c, d, 4, 5, 6, 7, 12, 13, 14, 15);
    v8 s = __builtin_shufflevector(ab, cd, 0, 1, 4, 5, 8, 9, 12, 13) + __builtin_shufflevector(ab, cd, 2, 3, 6, 7, 10, 11, 14, 15);
    return s + __builtin_shufflevector(s, s, 1, 0, 3, 2, 5, 4, 7, 6);
}

typedef struct {
    const float *q; int64_t q_row, q_head;
    const void *k, *v; int bf16; int64_t c_slot, c_head, c_pos;
    void *out; int64_t out_row; int out_bf16;
    const int64_t *seq; /* per sequence: slot, start, count, first row, tree offset (-1: a chain) */
    const uint8_t *trees;
    int H, KV, hd; float scale;
} Args;

typedef struct { int s, h, q0, q1; } Item;

/* Query rows q0 .. q1 - 1 (row j = q / G, head h * G + q % G) of sequence s against KV head h. */
static int run_item(const Args *a, const Item *it, int nc) {
    const int64_t *sq = a->seq + 5 * it->s;
    const int64_t slot = sq[0], start = sq[1], row0 = sq[3], tree = sq[4];
    const int64_t count = sq[2];
    const int G = a->H / a->KV, h = it->h, nq = it->q1 - it->q0;
    const int64_t kv_off = slot * a->c_slot + h * a->c_head;
    const int64_t span = ((start + (it->q1 - 1) / G + 1 + 15) / 16) * 16; /* keys the item reads */
    float *S = scratch((size_t)(nq + QB + 1) * span); /* the last row: a tree row's packed weights */
    if (!S) return 1;
    for (int b = 0; b < nq; b += QB) {
        v8 ql[QB][MAX_NC], qh[QB][MAX_NC];
        int64_t end[QB], last = 0;
        const uint8_t *mask[QB];
        for (int i = 0; i < QB; i++) {
            int qi = it->q0 + b + i;
            if (b + i < nq) {
                int64_t j = qi / G;
                const float *src = a->q + (row0 + j) * a->q_row + (int64_t)(h * G + qi % G) * a->q_head;
                for (int c = 0; c < nc; c++) ql[i][c] = load8(src + 16 * c), qh[i][c] = load8(src + 16 * c + 8);
                end[i] = start + j + 1;
                mask[i] = tree >= 0 ? a->trees + tree + j * count : NULL;
            } else {
                for (int c = 0; c < nc; c++) ql[i][c] = qh[i][c] = splat8(0.0f);
                end[i] = 0;
                mask[i] = NULL;
            }
            if (end[i] > last) last = end[i];
        }
        float *Sb = S + (size_t)b * span;
        /* scores: key by key, four rows at a time */
        for (int64_t t = 0; t < last; t++) {
            const int64_t off = kv_off + t * a->c_pos;
            v8 lo[QB], hi[QB];
            v8 kl = load_kv8(a->k, off, a->bf16), kh = load_kv8(a->k, off + 8, a->bf16);
            for (int i = 0; i < QB; i++) lo[i] = ql[i][0] * kl, hi[i] = qh[i][0] * kh;
            for (int c = 1; c < nc; c++) {
                kl = load_kv8(a->k, off + 16 * c, a->bf16);
                kh = load_kv8(a->k, off + 16 * c + 8, a->bf16);
                for (int i = 0; i < QB; i++) lo[i] = lo[i] + ql[i][c] * kl, hi[i] = hi[i] + qh[i][c] * kh;
            }
            v8 s = sum4h(lo[0] + hi[0], lo[1] + hi[1], lo[2] + hi[2], lo[3] + hi[3]);
            for (int i = 0; i < QB; i++) Sb[(size_t)i * span + t] = s[2 * i] * a->scale;
        }
        /* softmax numerators, row by row, over whole 16-key tiles (masked keys: -inf) */
        float inv[QB];
        for (int i = 0; i < QB; i++) {
            float *row = Sb + (size_t)i * span;
            int64_t n = end[i], tiles = (n + 15) / 16;
            inv[i] = 0.0f;
            if (n == 0) continue;
            for (int64_t t = n; t < tiles * 16; t++) row[t] = -__builtin_inff();
            if (mask[i])
                for (int64_t t = start; t < n; t++)
                    if (!mask[i][t - start]) row[t] = -__builtin_inff();
            v8 m = vmax8(load8(row), load8(row + 8));
            for (int64_t t = 1; t < tiles; t++) m = vmax8(m, vmax8(load8(row + 16 * t), load8(row + 16 * t + 8)));
            float top = m[0];
            for (int l = 1; l < 8; l++) top = m[l] > top ? m[l] : top;
            v8 mx = splat8(top);
            for (int64_t t = 0; t < 2 * tiles; t++) store8(row + 8 * t, vexp8(load8(row + 8 * t) - mx));
            /* A tree row's denominator sums its visible weights packed in order, so that each
             * lands in the lane it has in its path's chain (where the keys are consecutive). */
            const float *w = row;
            if (mask[i]) {
                float *packed = S + (size_t)(nq + QB) * span;
                int64_t used = start;
                memcpy(packed, row, (size_t)start * sizeof(float));
                for (int64_t t = start; t < n; t++)
                    if (mask[i][t - start]) packed[used++] = row[t];
                tiles = (used + 15) / 16;
                for (int64_t t = used; t < tiles * 16; t++) packed[t] = 0.0f;
                w = packed;
            }
            v8 lo = splat8(0.0f), hi = splat8(0.0f);
            for (int64_t t = 0; t < tiles; t++) lo = lo + load8(w + 16 * t), hi = hi + load8(w + 16 * t + 8);
            v8 z = splat8(0.0f);
            inv[i] = 1.0f / sum4h(lo + hi, z, z, z)[0];
        }
        /* values: per 16 lanes of the head, key by key in order, four rows at a time; the
         * keys every row of the block sees run without a test */
        int64_t common = last;
        for (int i = 0; i < QB && b + i < nq; i++) common = end[i] < common ? end[i] : common;
        for (int c = 0; c < 2 * nc; c++) {
            v8 acc[QB];
            const int64_t vo = kv_off + 8 * c;
            for (int i = 0; i < QB; i++) acc[i] = splat8(0.0f);
            for (int64_t t = 0; t < common; t++) {
                v8 vc = load_kv8(a->v, vo + t * a->c_pos, a->bf16);
                for (int i = 0; i < QB; i++) acc[i] = acc[i] + splat8(Sb[(size_t)i * span + t]) * vc;
            }
            for (int64_t t = common; t < last; t++) {
                v8 vc = load_kv8(a->v, vo + t * a->c_pos, a->bf16);
                for (int i = 0; i < QB; i++)
                    if (t < end[i]) acc[i] = acc[i] + splat8(Sb[(size_t)i * span + t]) * vc;
            }
            for (int i = 0; i < QB && b + i < nq; i++) {
                int qi = it->q0 + b + i;
                const int64_t at = (row0 + qi / G) * a->out_row + (int64_t)(h * G + qi % G) * a->hd + 8 * c;
                const v8 r = acc[i] * splat8(inv[i]);
                if (a->out_bf16) {
                    h8 hb = __builtin_convertvector(bf_bits8(r) >> 16, h8);
                    memcpy((uint16_t *)a->out + at, &hb, sizeof hb);
                } else {
                    store8((float *)a->out + at, r);
                }
            }
        }
    }
    return 0;
}

/* Specialised copies for the usual head sizes, so the lane loops unroll into registers. */
static int run_item_16(const Args *a, const Item *it) { return run_item(a, it, 1); }
static int run_item_32(const Args *a, const Item *it) { return run_item(a, it, 2); }
static int run_item_64(const Args *a, const Item *it) { return run_item(a, it, 4); }
static int run_item_128(const Args *a, const Item *it) { return run_item(a, it, 8); }

int dw_attend_version(void) { return 2; }

/* Returns 0, or 1 when memory ran out, 2 for a head size it does not cover. */
int dw_attend(const float *q, int64_t q_row, int64_t q_head, const void *k, const void *v, int bf16,
              int64_t c_slot, int64_t c_head, int64_t c_pos, void *out, int64_t out_row, int out_bf16, int n_seq,
              const int64_t *seq, const uint8_t *trees, int H, int KV, int hd, float scale, int threads) {
    int (*fn)(const Args *, const Item *);
    switch (hd) {
        case 16: fn = run_item_16; break;
        case 32: fn = run_item_32; break;
        case 64: fn = run_item_64; break;
        case 128: fn = run_item_128; break;
        default: return 2;
    }
    Args a = {q, q_row, q_head, k, v, bf16, c_slot, c_head, c_pos, out, out_row, out_bf16, seq, trees, H, KV, hd, scale};
    const int G = H / KV;
    int n = 0;
    for (int s = 0; s < n_seq; s++) n += KV * (int)((seq[5 * s + 2] * G + ITEM_ROWS - 1) / ITEM_ROWS);
    Item *items = (Item *)malloc(sizeof(Item) * (size_t)(n > 0 ? n : 1));
    if (!items) return 1;
    n = 0;
    for (int s = 0; s < n_seq; s++) {
        int m = (int)seq[5 * s + 2] * G;
        for (int h = 0; h < KV; h++)
            for (int q0 = 0; q0 < m; q0 += ITEM_ROWS)
                items[n++] = (Item){s, h, q0, q0 + ITEM_ROWS < m ? q0 + ITEM_ROWS : m};
    }
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) reduction(| : failed)
    for (int i = 0; i < n; i++) failed |= fn(&a, &items[i]);
    free(items);
    return failed;
}
