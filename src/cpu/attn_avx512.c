/* attn_avx512.c — AVX-512 attention over a group of query heads sharing one KV
 * head (GQA), bitwise equal to attn_head_generic run head by head:
 *   scores: lane = position; each (head, lane) is its own sequential fma chain over
 *           d. The group's heads, over two position groups at once, are 16 independent
 *           chains (each K vector converted once), so the loop is throughput-bound
 *           rather than fma-latency-bound.
 *   softmax: per head and chunk, exp as mathx_exp op for op, chunk sums in the
 *           32-lane order.
 *   o_c:    lane = dimension; per (head, lane) a sequential fma over the chunk's
 *           positions. Heads go in sets of 8 and dimensions in sets of 32 (16
 *           accumulators), so each V vector is converted once per head set.
 *   combine: O = fma(w, o_c, O) per chunk ascending, in `out`; out = O / L. */
#include <immintrin.h>
#include <math.h>

#include "common.h"
#include "cpu/attn.h"
#include "mathx.h"
#include "cpu/attn_chunked.h"
#include "cpu/exp_avx512.h"

#define AI static inline __attribute__((always_inline))
#define HMAX ATTN_HMAX /* heads per scores pass */
#define HSET 8 /* heads per o_c pass */
#define VSET 2 /* 16-dim vectors per o_c pass */
/* The arena's request distances, overridable at build time (e.g. CFLAGS_B='-DPF_V_FAR=0'
 * bench/ab_kernel.sh --attn-cold WORK WORK 512; bench/cpu-speed-log.md, nineteenth session). */
#ifndef PF_K_FAR
#define PF_K_FAR 8 /* position groups of K requested into L2 ahead of the scores (32 KB at hd 128); 0: none */
#endif
#ifndef PF_V_NEAR
#define PF_V_NEAR ATTN_CHUNK /* positions of V requested into L1 ahead of the PV pass (16 KB at hd 128) */
#endif
#ifndef PF_V_FAR
#define PF_V_FAR (2 * ATTN_CHUNK) /* positions of V requested into L2 ahead of it; 0: none */
#endif
#ifndef PF_K_NEAR
#define PF_K_NEAR 2 /* position groups of K requested into L1 ahead of the scores (8 KB at hd 128) */
#endif

static inline __m512 ld16h(const fp16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }

/* s[h][j] = scale * (q_h . k_j) for NH heads over the NG position groups from group g on
 * (lane = position). The NG x NH chains are independent, so two groups at once keep both FMA
 * pipes busy where one group's 8 chains wait on the FMA latency. The arena's K and V are usually
 * cold (a whole model streamed through the caches since the last step), so while these groups
 * are scored the K groups two ahead are requested into L1 and those PF_K_FAR ahead into L2 (past
 * K's last group, V's first ones, which pv_block reads next), NG lines each per two dims (a group
 * is hd/2 lines). V is requested by pv_block as it goes: asked for here, at the scores, a long
 * context's V left L1 before its turn (bench/cpu-speed-log.md, fifteenth session). */
AI void score_groups(const int NH, const int NG, const float *q, int hd, const fp16_t *K, const fp16_t *V, int g,
                     int ngr, int n, const __m512 vscale, float *s, size_t ss) {
    const size_t gs = (size_t)hd * KV_POS_GROUP; /* halves per position group */
    const fp16_t *kg = K + (size_t)g * gs;
    const char *kn = (const char *)(kg + PF_K_NEAR * gs);
    const int kn_lines = DT_MAX(0, DT_MIN(NG, ngr - (g + PF_K_NEAR))) * (hd / 2);
    const int gf = g + PF_K_FAR, in_k = gf < ngr;
    const char *kf = (const char *)(in_k ? K + (size_t)gf * gs : V + (size_t)(gf - ngr) * gs);
    const int kf_lines = PF_K_FAR ? DT_MAX(0, DT_MIN(NG, in_k ? ngr - gf : 2 * ngr - gf)) * (hd / 2) : 0;
    __m512 acc[2][HMAX];
    _Pragma("GCC unroll 2") for (int u = 0; u < NG; u++) _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
        acc[u][h] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d += 2) {
        _Pragma("GCC unroll 2") for (int u = 0; u < NG; u++) {
            const int l = (d / 2) * NG + u;
            if (l < kf_lines) _mm_prefetch(kf + 64 * l, _MM_HINT_T1);
            if (l < kn_lines) _mm_prefetch(kn + 64 * l, _MM_HINT_T0);
        }
        _Pragma("GCC unroll 2") for (int e = d; e < d + 2; e++) _Pragma("GCC unroll 2") for (int u = 0; u < NG; u++) {
            const __m512 k = ld16h(kg + (size_t)u * gs + (size_t)e * KV_POS_GROUP);
            _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
                acc[u][h] = _mm512_fmadd_ps(_mm512_set1_ps(q[(size_t)h * hd + e]), k, acc[u][h]);
        }
    }
    _Pragma("GCC unroll 2") for (int u = 0; u < NG; u++) {
        const int j0 = (g + u) * KV_POS_GROUP;
        const __mmask16 mk = mask16_first(n - j0);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++)
            _mm512_mask_storeu_ps(s + (size_t)h * ss + j0, mk, _mm512_mul_ps(acc[u][h], vscale));
    }
}

AI void scores_nh(const int NH, const float *q, int hd, const fp16_t *K, const fp16_t *V, int n, float scale,
                  float *s, size_t ss) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int ngr = (n + KV_POS_GROUP - 1) / KV_POS_GROUP;
    int g = 0;
    for (; g + 2 <= ngr; g += 2) score_groups(NH, 2, q, hd, K, V, g, ngr, n, vscale, s, ss);
    if (g < ngr) score_groups(NH, 1, q, hd, K, V, g, ngr, n, vscale, s, ss);
}

static void scores(const float *q, int nh, int hd, const fp16_t *K, const fp16_t *V, int n, float scale, float *s,
                   size_t ss) {
    switch (nh) {
    case 1: scores_nh(1, q, hd, K, V, n, scale, s, ss); break;
    case 2: scores_nh(2, q, hd, K, V, n, scale, s, ss); break;
    case 3: scores_nh(3, q, hd, K, V, n, scale, s, ss); break;
    case 4: scores_nh(4, q, hd, K, V, n, scale, s, ss); break;
    case 5: scores_nh(5, q, hd, K, V, n, scale, s, ss); break;
    case 6: scores_nh(6, q, hd, K, V, n, scale, s, ss); break;
    case 7: scores_nh(7, q, hd, K, V, n, scale, s, ss); break;
    default: scores_nh(8, q, hd, K, V, n, scale, s, ss); break;
    }
}

/* Chunk [j0, j0+len) of one head's scores: p = exp(s - m) in place; returns l_c (32-lane sum). */
static float chunk_exp(float *s, int len, float m) {
    __m512 A = _mm512_setzero_ps(), B = _mm512_setzero_ps();
    const __m512 vm = _mm512_set1_ps(m);
    for (int e = 0; e < len; e += 16) {
        __mmask16 mk = mask16_first(len - e);
        __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + e), vm));
        p = _mm512_maskz_mov_ps(mk, p);
        _mm512_mask_storeu_ps(s + e, mk, p);
        if ((e / 16) % 2 == 0)
            A = _mm512_mask_add_ps(A, mk, A, p);
        else
            B = _mm512_mask_add_ps(B, mk, B, p);
    }
    return butterfly32_zmm(A, B);
}

/* For NH heads and NV 16-dim vectors starting at dim 16*v0: o_c = sum over the chunk's
 * positions of p_j * V_j (sequential fma per lane), then O = fma(w_h, o_c, O). Beside each row's
 * load, the same 64 bytes of the rows one chunk ahead (into L1) and two chunks ahead (into L2) are
 * requested, while they lie before position n. */
AI void pv_block(const int NH, const int NV, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n,
                 int hd, int v0, const float *w, float *O) {
    __m512 oc[HSET][VSET];
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++)
        oc[h][v] = _mm512_setzero_ps();
    for (int j = j0; j < j1; j++) {
        const fp16_t *vj = V + (size_t)j * hd + 16 * v0;
        if (j + PF_V_NEAR < n) _mm_prefetch((const char *)(vj + (size_t)PF_V_NEAR * hd), _MM_HINT_T0);
        if (PF_V_FAR && j + PF_V_FAR < n) _mm_prefetch((const char *)(vj + (size_t)PF_V_FAR * hd), _MM_HINT_T1);
        __m512 vv[VSET];
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) vv[v] = ld16h(vj + 16 * v);
        _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
            const __m512 pj = _mm512_set1_ps(p[(size_t)h * ss + j]);
            _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) oc[h][v] = _mm512_fmadd_ps(pj, vv[v], oc[h][v]);
        }
    }
    _Pragma("GCC unroll 8") for (int h = 0; h < NH; h++) {
        const __m512 vw = _mm512_set1_ps(w[h]);
        _Pragma("GCC unroll 2") for (int v = 0; v < NV; v++) {
            float *o = O + (size_t)h * hd + 16 * (v0 + v);
            _mm512_storeu_ps(o, _mm512_fmadd_ps(vw, oc[h][v], _mm512_loadu_ps(o)));
        }
    }
}

#define PV_CASE(NH, NV)                                                                                      \
    case (NH - 1) * VSET + (NV - 1): pv_block(NH, NV, p, ss, V, j0, j1, n, hd, v0, w, O); break
static void pv(int nh, int nv, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, int v0,
               const float *w, float *O) {
    DT_ASSERT(nh >= 1 && nh <= HSET && nv >= 1 && nv <= VSET);
    switch ((nh - 1) * VSET + (nv - 1)) {
        PV_CASE(1, 1); PV_CASE(1, 2); PV_CASE(2, 1); PV_CASE(2, 2); PV_CASE(3, 1); PV_CASE(3, 2);
        PV_CASE(4, 1); PV_CASE(4, 2); PV_CASE(5, 1); PV_CASE(5, 2); PV_CASE(6, 1); PV_CASE(6, 2);
        PV_CASE(7, 1); PV_CASE(7, 2); PV_CASE(8, 1); PV_CASE(8, 2);
    default: DT_ASSERT(0);
    }
}

/* Every head set of the chunk, in sets of HSET heads x VSET 16-dim vectors. */
static void pv_chunk(int nh, const float *p, size_t ss, const fp16_t *V, int j0, int j1, int n, int hd, const float *w,
                     float *O) {
    const int nv = hd / 16;
    for (int hs = 0; hs < nh; hs += HSET)
        for (int v0 = 0; v0 < nv; v0 += VSET)
            pv(DT_MIN(HSET, nh - hs), DT_MIN(VSET, nv - v0), p + hs * ss, ss, V, j0, j1, n, hd, v0, w + hs,
               O + (size_t)hs * hd);
}

static void div_rows(float *O, int nh, int hd, const float *L) {
    for (int h = 0; h < nh; h++) {
        const __m512 vL = _mm512_set1_ps(L[h]);
        for (int v = 0; v < hd / 16; v++) {
            float *o = O + (size_t)h * hd + 16 * v;
            _mm512_storeu_ps(o, _mm512_div_ps(_mm512_loadu_ps(o), vL));
        }
    }
}

static const attn_chunked_ops ops_avx512 = {
    .k_near = PF_K_NEAR, .scores = scores, .scan_max = scan_max16, .chunk_exp = chunk_exp,
    .pv_chunk = pv_chunk, .div_rows = div_rows,
};

void attn_group_avx512(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                       float *out, float *scratch) {
    DT_ASSERT(hd % 16 == 0 && ng >= 1);
    attn_chunked(&ops_avx512, q, ng, K, V, pos, hd, scale, out, scratch);
}
