/* exp_avx512.h — mathx_exp on 16 lanes, and the 32-lane sum helpers shared by the
 * AVX-512 kernels (include only from *_avx512.c files). */
#ifndef DITTO_EXP_AVX512_H
#define DITTO_EXP_AVX512_H

#include <immintrin.h>
#include <math.h>

#include "mathx.h"

/* mathx_exp on 16 lanes, the same operations in the same order. */
static inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(MATHX_EXP_LO), hi = _mm512_set1_ps(MATHX_EXP_HI);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 z = _mm512_mul_ps(r, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, z, r), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    /* lanes outside [LO, HI] or NaN: the scalar special cases (computed garbage discarded) */
    __mmask16 small = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), big = _mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __mmask16 normal = (__mmask16) ~(small | big | nan);
    __m512 res = _mm512_maskz_mul_ps(normal, y, _mm512_castsi512_ps(e));
    res = _mm512_mask_mov_ps(res, big, _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(res, nan, x);
}

/* Mask of the first min(rem, 16) lanes. */
static inline __mmask16 mask16_first(int rem) {
    return rem >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << rem) - 1u);
}

/* mathx_butterfly32 of the 32 lanes held as lanes 0..15 in A, 16..31 in B: each level's
 * lane[i] = lane[i] + lane[i+s] as one vector add, operands in the scalar order. */
static inline float butterfly32_zmm(__m512 A, __m512 B) {
    const __m512 s16 = _mm512_add_ps(A, B);
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(s16), _mm512_extractf32x8_ps(s16, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The scan m = -inf; for j: m = s[j] > m ? s[j] : m, on 16 lanes: _mm512_max_ps(x, m) is
 * (x > m ? x : m) per lane, so NaN is never taken, and the lanes' maximum is the scan's value.
 * Only its sign can differ when that value is zero (no zero is > another, so the scan keeps
 * the first zero it meets): then the first zero is returned. */
static inline float scan_max16(const float *s, int n) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= n; j += 16) m = _mm512_max_ps(_mm512_loadu_ps(s + j), m);
    if (j < n) {
        const __mmask16 k = mask16_first(n - j);
        m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, s + j), m);
    }
    const float r = _mm512_reduce_max_ps(m);
    if (r == 0.0f)
        for (j = 0; j < n; j++)
            if (s[j] == 0.0f) return s[j];
    return r;
}

#endif
