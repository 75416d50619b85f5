/* attn_avx512.c — AVX-512 attention head, bitwise equal to attn_head_generic:
 * scores with lane = position (each lane its own sequential fma chain over d, K
 * loaded 16 positions at a time from the interleaved layout); exp as mathx_exp op
 * for op; chunk sums in the 32-lane order; o_c with lane = dimension (sequential
 * fma over positions per lane). */
#include <immintrin.h>
#include <math.h>

#include "cpu/attn.h"
#include "mathx.h"
#include "cpu/exp_avx512.h"

void attn_head_avx512(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                      float *scratch) {
    int n = pos + 1, nv = hd / 16;
    float *s = scratch; /* scores; o_c and O live in registers */
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int j0 = 0; j0 < n; j0 += KV_POS_GROUP) {
        const fp16_t *kg = K + (size_t)(j0 / KV_POS_GROUP) * hd * KV_POS_GROUP;
        __m512 acc = _mm512_setzero_ps();
        for (int d = 0; d < hd; d++)
            acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]),
                                  _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kg + (size_t)d * KV_POS_GROUP))),
                                  acc);
        __mmask16 mk = n - j0 >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j0)) - 1);
        _mm512_mask_storeu_ps(s + j0, mk, _mm512_mul_ps(acc, vscale));
    }
    float M = -INFINITY;
    for (int j = 0; j < n; j++) M = s[j] > M ? s[j] : M;
    float L = 0.0f;
    __m512 Ov[16];
    for (int v = 0; v < nv; v++) Ov[v] = _mm512_setzero_ps();
    for (int j0 = 0; j0 < n; j0 += ATTN_CHUNK) {
        int j1 = n < j0 + ATTN_CHUNK ? n : j0 + ATTN_CHUNK, len = j1 - j0;
        float m = -INFINITY;
        for (int j = j0; j < j1; j++) m = s[j] > m ? s[j] : m;
        /* p = exp(s - m); lanes e mod 32 of the chunk: A holds lanes 0..15, B 16..31 */
        __m512 A = _mm512_setzero_ps(), B = _mm512_setzero_ps();
        const __m512 vm = _mm512_set1_ps(m);
        for (int e = 0; e < len; e += 16) {
            __mmask16 mk = len - e >= 16 ? 0xFFFF : (__mmask16)((1u << (len - e)) - 1);
            __m512 p = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + j0 + e), vm));
            p = _mm512_maskz_mov_ps(mk, p);
            _mm512_mask_storeu_ps(s + j0 + e, mk, p);
            if ((e / 16) % 2 == 0)
                A = _mm512_mask_add_ps(A, mk, A, p);
            else
                B = _mm512_mask_add_ps(B, mk, B, p);
        }
        /* butterfly +16, +8, +4, +2, +1 */
        float lane[32];
        _mm512_storeu_ps(lane, A);
        _mm512_storeu_ps(lane + 16, B);
        float l = mathx_butterfly32(lane);
        __m512 ocv[16];
        for (int v = 0; v < nv; v++) ocv[v] = _mm512_setzero_ps();
        for (int j = j0; j < j1; j++) {
            const __m512 pj = _mm512_set1_ps(s[j]);
            const fp16_t *vj = V + (size_t)j * hd;
            for (int v = 0; v < nv; v++)
                ocv[v] = _mm512_fmadd_ps(pj, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vj + 16 * v))), ocv[v]);
        }
        float w = mathx_exp(m - M);
        L = fmaf(w, l, L);
        const __m512 vw = _mm512_set1_ps(w);
        for (int v = 0; v < nv; v++) Ov[v] = _mm512_fmadd_ps(vw, ocv[v], Ov[v]);
    }
    const __m512 vL = _mm512_set1_ps(L);
    for (int v = 0; v < nv; v++) _mm512_storeu_ps(out + 16 * v, _mm512_div_ps(Ov[v], vL));
}
