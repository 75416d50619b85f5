/* attn_chunked.h — the contract's chunked softmax over a group of query heads, shared by the
 * SIMD attention flavours (attn_avx2.c, attn_avx512.c; include only from them). Each flavour
 * gives its own vector steps; the order of the fp32 operations between them is fixed here:
 *   per set of up to 8 heads: the scores s (ops->scores), M = scan maximum of each head's scores;
 *   per chunk of ATTN_CHUNK positions, ascending: m = its scan maximum, p = exp(s - m) in place
 *   and l = the 32-lane sum of p (ops->chunk_exp), w = exp(m - M), L = fma(w, l, L), then
 *   O = fma(w, o_c, O) over the chunk (ops->pv_chunk); finally out = O / L (ops->div_rows).
 * The driver is always inlined with a constant ops, so every step is a direct call. */
#ifndef DITTO_CPU_ATTN_CHUNKED_H
#define DITTO_CPU_ATTN_CHUNKED_H

#include <immintrin.h>
#include <math.h>

#include "common.h"
#include "cpu/attn.h"
#include "mathx.h"

#define ATTN_HMAX 8 /* heads per scores pass */

typedef struct {
    int k_near; /* K position groups requested into L1 before the scores (they request the rest) */
    /* s[h * ss + j] = scale * (q_h . k_j), j < n, for nh <= ATTN_HMAX heads */
    void (*scores)(const float *q, int nh, int hd, const fp16_t *K, const fp16_t *V, int n, float scale, float *s,
                   size_t ss);
    float (*scan_max)(const float *s, int n); /* mathx_scan_max */
    float (*chunk_exp)(float *s, int len, float m); /* p = exp(s - m) in place; returns the 32-lane sum */
    /* O[h] = fma(w[h], o_c[h], O[h]), o_c[h][d] = sequential fma over positions [j0, j1) of p[h][j] * V[j][d] */
    void (*pv_chunk)(int nh, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, const float *w,
                     float *O);
    void (*div_rows)(float *O, int nh, int hd, const float *L); /* O[h][d] = O[h][d] / L[h] */
} attn_chunked_ops;

static inline __attribute__((always_inline)) void attn_chunked(const attn_chunked_ops *ops, const float *q, int ng,
                                                                const fp16_t *K, const fp16_t *V, int pos, int hd,
                                                                float scale, float *out, float *scratch) {
    const int n = pos + 1;
    const size_t ss = ((size_t)n + 15) & ~(size_t)15;
    for (int h0 = 0; h0 < ng; h0 += ATTN_HMAX) {
        const int nh = DT_MIN(ATTN_HMAX, ng - h0);
        float *s = scratch, *O = out + (size_t)h0 * hd;
        if (h0 == 0) /* the first k_near K groups (whole: positions interleave within one) */
            for (size_t o = 0; o < (size_t)DT_MIN((n + KV_POS_GROUP - 1) / KV_POS_GROUP, ops->k_near) * KV_POS_GROUP * hd *
                                       sizeof(fp16_t);
                 o += 64)
                _mm_prefetch((const char *)K + o, _MM_HINT_T0);
        ops->scores(q + (size_t)h0 * hd, nh, hd, K, V, n, scale, s, ss);
        float M[ATTN_HMAX], L[ATTN_HMAX], w[ATTN_HMAX];
        for (int h = 0; h < nh; h++) {
            M[h] = ops->scan_max(s + h * ss, n);
            L[h] = 0.0f;
        }
        for (size_t i = 0; i < (size_t)nh * hd; i++) O[i] = 0.0f;
        for (int j0 = 0; j0 < n; j0 += ATTN_CHUNK) {
            const int j1 = DT_MIN(n, j0 + ATTN_CHUNK);
            for (int h = 0; h < nh; h++) {
                float *sh = s + h * ss;
                const float m = ops->scan_max(sh + j0, j1 - j0);
                const float l = ops->chunk_exp(sh + j0, j1 - j0, m);
                w[h] = mathx_exp(m - M[h]);
                L[h] = fmaf(w[h], l, L[h]);
            }
            ops->pv_chunk(nh, s, ss, V, j0, j1, n, hd, w, O);
        }
        ops->div_rows(O, nh, hd, L);
    }
}

#endif
