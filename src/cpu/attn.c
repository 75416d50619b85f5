/* attn.c — scalar reference attention and flavour selection. */
#include "cpu/attn.h"

#include <immintrin.h>
#include <math.h>

#include "cpu/cpu_quant.h"
#include "cpu/vec.h"
#include "mathx.h"

static inline float h2f(fp16_t h) { return _cvtsh_ss(h); }

void attn_head_generic(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                       float *scratch) {
    int n = pos + 1;
    float *s = scratch, *oc = scratch + n, *O = oc + hd;
    /* scores: sequential fma over the head dimension, then one multiply by the scale */
    for (int j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int d = 0; d < hd; d++) acc = fmaf(q[d], h2f(K[kv_k_index(j, d, hd)]), acc);
        s[j] = acc * scale;
    }
    int nc = (n + ATTN_CHUNK - 1) / ATTN_CHUNK;
    float M = mathx_scan_max(s, n);
    float L = 0.0f;
    for (int d = 0; d < hd; d++) O[d] = 0.0f;
    for (int c = 0; c < nc; c++) {
        int j0 = c * ATTN_CHUNK, j1 = n < j0 + ATTN_CHUNK ? n : j0 + ATTN_CHUNK;
        float m = mathx_scan_max(s + j0, j1 - j0);
        for (int j = j0; j < j1; j++) s[j] = mathx_exp(s[j] - m);
        float l = mathx_sum32(s + j0, j1 - j0);
        for (int d = 0; d < hd; d++) oc[d] = 0.0f;
        for (int j = j0; j < j1; j++)
            for (int d = 0; d < hd; d++) oc[d] = fmaf(s[j], h2f(V[(size_t)j * hd + d]), oc[d]);
        float w = mathx_exp(m - M);
        L = fmaf(w, l, L);
        for (int d = 0; d < hd; d++) O[d] = fmaf(w, oc[d], O[d]);
    }
    for (int d = 0; d < hd; d++) out[d] = O[d] / L;
}

void attn_group_generic(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                        float *out, float *scratch) {
    for (int g = 0; g < ng; g++)
        attn_head_generic(q + (size_t)g * hd, K, V, pos, hd, scale, out + (size_t)g * hd, scratch);
}

attn_fn attn_select(int cpu_level, int hd) {
    if (cpu_level >= CPU_AVX512 && hd % 16 == 0) return attn_group_avx512;
    if (cpu_level >= CPU_AVX2 && hd % 8 == 0) return attn_group_avx2;
    return attn_group_generic;
}

void vec_swiglu_generic(const float *g, const float *u, float *h, int n) {
    for (int i = 0; i < n; i++) h[i] = mathx_silu(g[i]) * u[i];
}

void vec_rmsnorm_generic(float *y, const float *x, const float *w, int n, float eps) {
    mathx_rmsnorm(y, x, w, n, eps);
}

vec_rmsnorm_fn vec_rmsnorm_select(int cpu_level) {
    return cpu_level >= CPU_AVX512 ? vec_rmsnorm_avx512 : cpu_level >= CPU_AVX2 ? vec_rmsnorm_avx2 : vec_rmsnorm_generic;
}

vec_swiglu_fn vec_swiglu_select(int cpu_level) {
    return cpu_level >= CPU_AVX512 ? vec_swiglu_avx512 : cpu_level >= CPU_AVX2 ? vec_swiglu_avx2 : vec_swiglu_generic;
}
