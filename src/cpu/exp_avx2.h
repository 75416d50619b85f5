/* exp_avx2.h — mathx_exp on 8 lanes, the 32-lane sum and the scan maximum for the AVX2
 * kernels (include only from *_avx2.c files): the same operations in the same order as
 * mathx.h's scalar forms and exp_avx512.h's 16-lane ones. */
#ifndef DITTO_EXP_AVX2_H
#define DITTO_EXP_AVX2_H

#include <immintrin.h>
#include <math.h>

#include "mathx.h"

/* mathx_exp on 8 lanes, the same operations in the same order. */
static inline __m256 exp8(__m256 x) {
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, z, r), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    /* lanes outside [LO, HI] or NaN: the scalar special cases (computed garbage discarded) */
    const __m256 small = _mm256_cmp_ps(x, _mm256_set1_ps(MATHX_EXP_LO), _CMP_LT_OQ);
    const __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(MATHX_EXP_HI), _CMP_GT_OQ);
    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 res = _mm256_andnot_ps(_mm256_or_ps(small, _mm256_or_ps(big, nan)), _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
    res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), big);
    return _mm256_blendv_ps(res, x, nan);
}

/* All-ones in the first min(rem, 8) lanes (for maskload / maskstore / blendv). */
static inline __m256i mask8_first(int rem) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(rem < 8 ? rem : 8), idx);
}

/* mathx_butterfly32 of the 32 lanes held as lanes 0..7 in A, 8..15 in B, 16..23 in C and
 * 24..31 in D: each level's lane[i] = lane[i] + lane[i+s] as one vector add, operands in the
 * scalar order. */
static inline float butterfly32_ymm(__m256 A, __m256 B, __m256 C, __m256 D) {
    const __m256 s16a = _mm256_add_ps(A, C), s16b = _mm256_add_ps(B, D);
    const __m256 s8 = _mm256_add_ps(s16a, s16b);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The scan m = -inf; for j: m = s[j] > m ? s[j] : m, on 8 lanes (as scan_max16 in
 * exp_avx512.h): _mm256_max_ps(x, m) is (x > m ? x : m) per lane, so NaN is never taken; a
 * zero maximum returns the first zero (the scan keeps the first zero it meets). */
static inline float scan_max8(const float *s, int n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(s + j), m);
    if (j < n) {
        const __m256i k = mask8_first(n - j);
        m = _mm256_blendv_ps(m, _mm256_max_ps(_mm256_maskload_ps(s + j, k), m), _mm256_castsi256_ps(k));
    }
    /* no lane holds NaN, so the lanes' maximum does not depend on the order taken */
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float r = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
    if (r == 0.0f)
        for (j = 0; j < n; j++)
            if (s[j] == 0.0f) return s[j];
    return r;
}

#endif
