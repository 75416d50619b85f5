/* attn_avx2.c — AVX2 attention over a group of query heads sharing one KV head (GQA),
 * bitwise equal to attn_head_generic run head by head; attn_avx512.c's order on 8 lanes:
 *   scores: lane = position; each (head, lane) is its own sequential fma chain over d. A
 *           position group (16 positions, two vectors) is scored for up to 4 heads at once
 *           (8 independent chains, each K vector converted once per 4 heads; the group's
 *           K stays in L1 for the next 4).
 *   softmax: per head and chunk, exp as mathx_exp op for op, chunk sums in the 32-lane order.
 *   o_c:    lane = dimension; per (head, lane) a sequential fma over the chunk's positions,
 *           8 heads x 8 dimensions per pass (each V vector converted once per 8 heads).
 *   combine: O = fma(w, o_c, O) per chunk ascending, in `out`; out = O / L.
 * K and V are requested ahead as attn_avx512.c does (the arena is cold at every step). */
#include <immintrin.h>
#include <math.h>

#include "common.h"
#include "cpu/attn.h"
#include "cpu/attn_chunked.h"
#include "cpu/exp_avx2.h"
#include "mathx.h"

#define AI static inline __attribute__((always_inline))
#define HSUB 4  /* heads whose chains run together on a position group */
#define HSET 8  /* heads per o_c pass */
#define PF_K_FAR 8            /* position groups of K requested into L2 ahead of the scores */
#define PF_K_NEAR 2           /* ... and into L1 */
#define PF_V_NEAR ATTN_CHUNK  /* positions of V requested into L1 ahead of the PV pass */
#define PF_V_FAR (2 * ATTN_CHUNK) /* ... and into L2 */
#ifndef ATT2_NEAR_HINT
#define ATT2_NEAR_HINT _MM_HINT_T0 /* the near requests' level (bench/ab_kernel.sh --attn-cold A/Bs it) */
#endif

static inline __m256 ld8h(const fp16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }

/* s[h][j] = scale * (q_h . k_j), heads h0 .. h0+NH-1 (NH <= HSUB) of the pass, over position
 * group g (lane = position; positions at or past n are not stored). */
AI void score_group(const int NH, const float *q, int hd, const fp16_t *kg, int j0, int n, const __m256 vscale,
                    float *s, size_t ss) {
    __m256 acc[HSUB][2];
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    for (int e = 0; e < hd; e++) {
        const __m256 k0 = ld8h(kg + (size_t)e * KV_POS_GROUP), k1 = ld8h(kg + (size_t)e * KV_POS_GROUP + 8);
        _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
            const __m256 qv = _mm256_broadcast_ss(q + (size_t)h * hd + e);
            acc[h][0] = _mm256_fmadd_ps(qv, k0, acc[h][0]);
            acc[h][1] = _mm256_fmadd_ps(qv, k1, acc[h][1]);
        }
    }
    const __m256i m0 = mask8_first(n - j0), m1 = mask8_first(n - j0 - 8);
    _Pragma("GCC unroll 4") for (int h = 0; h < NH; h++) {
        _mm256_maskstore_ps(s + (size_t)h * ss + j0, m0, _mm256_mul_ps(acc[h][0], vscale));
        _mm256_maskstore_ps(s + (size_t)h * ss + j0 + 8, m1, _mm256_mul_ps(acc[h][1], vscale));
    }
}

static void score_sub(int nh, const float *q, int hd, const fp16_t *kg, int j0, int n, const __m256 vscale, float *s,
                      size_t ss) {
    switch (nh) {
    case 1: score_group(1, q, hd, kg, j0, n, vscale, s, ss); break;
    case 2: score_group(2, q, hd, kg, j0, n, vscale, s, ss); break;
    case 3: score_group(3, q, hd, kg, j0, n, vscale, s, ss); break;
    default: score_group(4, q, hd, kg, j0, n, vscale, s, ss); break;
    }
}

/* Scores of nh <= ATTN_HMAX heads over all n positions, group by group; before each group, the K
 * group PF_K_NEAR ahead is requested into L1 and the one PF_K_FAR ahead into L2 (past K's
 * last group, V's first rows, which the PV pass reads next). */
static void scores(const float *q, int nh, int hd, const fp16_t *K, const fp16_t *V, int n, float scale, float *s,
                   size_t ss) {
    const __m256 vscale = _mm256_set1_ps(scale);
    const size_t gs = (size_t)hd * KV_POS_GROUP; /* halves per position group */
    const int ngr = (n + KV_POS_GROUP - 1) / KV_POS_GROUP, lines = hd / 2;
    for (int g = 0; g < ngr; g++) {
        if (g + PF_K_NEAR < ngr)
            for (int l = 0; l < lines; l++) _mm_prefetch((const char *)(K + (size_t)(g + PF_K_NEAR) * gs) + 64 * l, ATT2_NEAR_HINT);
        const int gf = g + PF_K_FAR;
        if (gf < 2 * ngr) {
            const char *kf = (const char *)(gf < ngr ? K + (size_t)gf * gs : V + (size_t)(gf - ngr) * gs);
            for (int l = 0; l < lines; l++) _mm_prefetch(kf + 64 * l, _MM_HINT_T1);
        }
        const fp16_t *kg = K + (size_t)g * gs;
        for (int h = 0; h < nh; h += HSUB)
            score_sub(DT_MIN(HSUB, nh - h), q + (size_t)h * hd, hd, kg, g * KV_POS_GROUP, n, vscale, s + (size_t)h * ss, ss);
    }
}

/* Chunk [j0, j0+len) of one head's scores: p = exp(s - m) in place; returns l_c (32-lane sum). */
static float chunk_exp(float *s, int len, float m) {
    __m256 A[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    const __m256 vm = _mm256_set1_ps(m);
    int e = 0;
    for (; e + 8 <= len; e += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + e), vm));
        _mm256_storeu_ps(s + e, p);
        A[(e / 8) % 4] = _mm256_add_ps(A[(e / 8) % 4], p);
    }
    if (e < len) {
        const __m256i k = mask8_first(len - e);
        const __m256 p = exp8(_mm256_sub_ps(_mm256_maskload_ps(s + e, k), vm));
        _mm256_maskstore_ps(s + e, k, p);
        A[(e / 8) % 4] = _mm256_blendv_ps(A[(e / 8) % 4], _mm256_add_ps(A[(e / 8) % 4], p), _mm256_castsi256_ps(k));
    }
    return butterfly32_ymm(A[0], A[1], A[2], A[3]);
}

/* For NH heads and the 8 dims from dim 8*v0: o_c = sum over the chunk's positions of
 * p_j * V_j (sequential fma per lane), then O = fma(w_h, o_c, O). At the first vector of each
 * 64-byte line of a row, that line's bytes one chunk ahead (into L1) and two chunks ahead (into
 * L2) are requested, while they lie before position n. */
AI void pv_block(const int NH, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, int v0,
                 const float *w, float *O) {
    __m256 oc[HSET];
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) oc[h] = _mm256_setzero_ps();
    const bool line = v0 % 4 == 0;
    for (int j = j0; j < j1; j++) {
        const fp16_t *vj = V + (size_t)j * hd + 8 * v0;
        if (line && j + PF_V_NEAR < n) _mm_prefetch((const char *)(vj + (size_t)PF_V_NEAR * hd), ATT2_NEAR_HINT);
        if (line && j + PF_V_FAR < n) _mm_prefetch((const char *)(vj + (size_t)PF_V_FAR * hd), _MM_HINT_T1);
        const __m256 vv = ld8h(vj);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
            oc[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + (size_t)h * ss + j), vv, oc[h]);
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
        float *o = O + (size_t)h * hd + 8 * v0;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(w[h]), oc[h], _mm256_loadu_ps(o)));
    }
}

#define PV_CASE(NH) \
    case NH: pv_block(NH, p, ss, V, j0, j1, n, hd, v0, w, O); break
static void pv(int nh, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, int v0, const float *w,
               float *O) {
    switch (nh) {
        PV_CASE(1); PV_CASE(2); PV_CASE(3); PV_CASE(4); PV_CASE(5); PV_CASE(6); PV_CASE(7); PV_CASE(8);
    default: DT_ASSERT(0);
    }
}

/* Every 8-dim vector of the chunk, for all the set's heads at once. */
static void pv_chunk(int nh, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, const float *w,
                     float *O) {
    for (int v0 = 0; v0 < hd / 8; v0++) pv(nh, p, ss, V, j0, j1, n, hd, v0, w, O);
}

static void div_rows(float *O, int nh, int hd, const float *L) {
    for (int h = 0; h < nh; h++) {
        const __m256 vL = _mm256_set1_ps(L[h]);
        for (int v = 0; v < hd / 8; v++) {
            float *o = O + (size_t)h * hd + 8 * v;
            _mm256_storeu_ps(o, _mm256_div_ps(_mm256_loadu_ps(o), vL));
        }
    }
}

static const attn_chunked_ops ops_avx2 = {
    .k_near = PF_K_NEAR, .scores = scores, .scan_max = scan_max8, .chunk_exp = chunk_exp,
    .pv_chunk = pv_chunk, .div_rows = div_rows,
};

void attn_group_avx2(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                     float *scratch) {
    DT_ASSERT(hd % 8 == 0 && ng >= 1);
    attn_chunked(&ops_avx2, q, ng, K, V, pos, hd, scale, out, scratch);
}
