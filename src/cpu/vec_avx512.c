/* vec_avx512.c — elementwise kernels on 16 lanes, bitwise equal to their scalar forms
 * in cpu_backend.c (tests/test_attn.c checks them). */
#include "cpu/exp_avx512.h"
#include "cpu/vec.h"

/* h = silu(g) * u = (g / (1 + exp(-g))) * u */
void vec_swiglu_avx512(const float *g, const float *u, float *h, int n) {
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 x = _mm512_maskz_loadu_ps(m, g + i);
        __m512 e = exp16(_mm512_xor_ps(x, sign));
        __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
    }
}
