/* vec_avx2.c — elementwise kernels on 8 lanes, bitwise equal to their scalar forms
 * (tests/test_attn.c checks them); the AVX2 level's counterparts of vec_avx512.c. */
#include "cpu/exp_avx2.h"
#include "cpu/vec.h"
#include "mathx.h"

/* h = silu(g) * u = (g / (1 + exp(-g))) * u; g and u read a KiB ahead (see vec_avx512.c). */
void vec_swiglu_avx2(const float *g, const float *u, float *h, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        if (i % 16 == 0) {
            _mm_prefetch((const char *)(g + i + 256), _MM_HINT_T0);
            _mm_prefetch((const char *)(u + i + 256), _MM_HINT_T0);
        }
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign))));
        _mm256_storeu_ps(h + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
    }
    if (i < n) {
        const __m256i k = mask8_first(n - i);
        const __m256 x = _mm256_maskload_ps(g + i, k);
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, sign))));
        _mm256_maskstore_ps(h + i, k, _mm256_mul_ps(s, _mm256_maskload_ps(u + i, k)));
    }
}

/* The 32-lane sum of squares in four registers: lane e%32 gets x_e's fma in ascending e,
 * exactly as mathx_sumsq32 (a partial last vector leaves the lanes past n as they were);
 * then the same butterfly. */
void vec_rmsnorm_avx2(float *y, const float *x, const float *w, int n, float eps) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        acc[(i / 8) % 4] = _mm256_fmadd_ps(v, v, acc[(i / 8) % 4]);
    }
    if (i < n) {
        const __m256i k = mask8_first(n - i);
        const __m256 v = _mm256_maskload_ps(x + i, k), a = acc[(i / 8) % 4];
        acc[(i / 8) % 4] = _mm256_blendv_ps(a, _mm256_fmadd_ps(v, v, a), _mm256_castsi256_ps(k));
    }
    const float ss = butterfly32_ymm(acc[0], acc[1], acc[2], acc[3]);
    const __m256 r = _mm256_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    for (i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r), _mm256_loadu_ps(w + i)));
    if (i < n) {
        const __m256i k = mask8_first(n - i);
        const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, k), r);
        _mm256_maskstore_ps(y + i, k, _mm256_mul_ps(v, _mm256_maskload_ps(w + i, k)));
    }
}

float vec_scan_max_avx2(const float *s, int n) { return scan_max8(s, n); }
