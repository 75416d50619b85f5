/* vec_avx512.c — elementwise kernels on 16 lanes, bitwise equal to their scalar forms
 * in cpu_backend.c (tests/test_attn.c checks them). */
#include "cpu/exp_avx512.h"
#include "cpu/vec.h"
#include "mathx.h"

/* h = silu(g) * u = (g / (1 + exp(-g))) * u. g and u were just written by the gate/up
 * projection, on either thread: they are read a KiB ahead. */
void vec_swiglu_avx512(const float *g, const float *u, float *h, int n) {
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 16) {
        _mm_prefetch((const char *)(g + i + 256), _MM_HINT_T0);
        _mm_prefetch((const char *)(u + i + 256), _MM_HINT_T0);
        __mmask16 m = mask16_first(n - i);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp16(_mm512_xor_ps(x, sign));
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}

/* Lanes 0..15 and 16..31 of the 32-lane sum of squares in two registers: lane e%32 gets
 * x_e's fma in ascending e, exactly as mathx_sumsq32; then the same butterfly. */
void vec_rmsnorm_avx512(float *y, const float *x, const float *w, int n, float eps) {
    __m512 A = _mm512_setzero_ps(), B = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16_first(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        if ((i / 16) % 2 == 0)
            A = _mm512_mask3_fmadd_ps(v, v, A, m);
        else
            B = _mm512_mask3_fmadd_ps(v, v, B, m);
    }
    float ss = butterfly32_zmm(A, B);
    const __m512 r = _mm512_set1_ps(1.0f / sqrtf(ss / (float)n + eps));
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = mask16_first(n - i);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), r);
        _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
    }
}

float vec_scan_max_avx512(const float *s, int n) { return scan_max16(s, n); }
