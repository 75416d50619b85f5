/* vec.h — elementwise kernels with SIMD flavours bitwise equal to the scalar form. */
#ifndef DITTO_VEC_H
#define DITTO_VEC_H

#include <immintrin.h>
#include <math.h>

/* Element-wise helpers on the baseline ISA (AVX + FMA, 8 lanes): each element gets the
 * same single operation as the scalar loop, so they are exact by construction. */

/* x[i] = x[i] + t[i] */
static inline void vec_add(float *x, const float *t, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(t + i)));
    for (; i < n; i++) x[i] = x[i] + t[i];
}

/* acc[i] = fma(w, y[i], acc[i]) */
static inline void vec_fma_acc(float *acc, float w, const float *y, int n) {
    const __m256 vw = _mm256_set1_ps(w);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(vw, _mm256_loadu_ps(y + i), _mm256_loadu_ps(acc + i)));
    for (; i < n; i++) acc[i] = fmaf(w, y[i], acc[i]);
}

typedef void (*vec_swiglu_fn)(const float *g, const float *u, float *h, int n);

/* h[i] = mathx_silu(g[i]) * u[i] */
void vec_swiglu_generic(const float *g, const float *u, float *h, int n);
void vec_swiglu_avx512(const float *g, const float *u, float *h, int n);
vec_swiglu_fn vec_swiglu_select(int cpu_level);

typedef void (*vec_rmsnorm_fn)(float *y, const float *x, const float *w, int n, float eps);

/* mathx_rmsnorm (32-lane sum of squares, r = 1/sqrt(ss/n + eps), y = (x*r)*w); y may alias x */
void vec_rmsnorm_generic(float *y, const float *x, const float *w, int n, float eps);
void vec_rmsnorm_avx512(float *y, const float *x, const float *w, int n, float eps);
vec_rmsnorm_fn vec_rmsnorm_select(int cpu_level);

/* mathx_scan_max on 16 lanes (the attention kernel's inline form, exported for its test) */
float vec_scan_max_avx512(const float *s, int n);

#endif
