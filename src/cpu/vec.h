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

/* d[i] = x[i] + t[i] */
static inline void vec_sum(float *d, const float *x, const float *t, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(t + i)));
    for (; i < n; i++) d[i] = x[i] + t[i];
}

/* Rotary embedding of one head in the split-halves form: for i < half, with x0 = v[i] and
 * x1 = v[i + half], v[i] = (x0 * c[i]) - (x1 * s[i]) and v[i + half] = (x1 * c[i]) + (x0 * s[i]). */
static inline void vec_rope(float *v, const float *c, const float *s, int half) {
    int i = 0;
    for (; i + 8 <= half; i += 8) {
        const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + half + i);
        const __m256 vc = _mm256_loadu_ps(c + i), vs = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(x0, vc), _mm256_mul_ps(x1, vs)));
        _mm256_storeu_ps(v + half + i, _mm256_add_ps(_mm256_mul_ps(x1, vc), _mm256_mul_ps(x0, vs)));
    }
    for (; i < half; i++) {
        const float x0 = v[i], x1 = v[i + half];
        v[i] = (x0 * c[i]) - (x1 * s[i]);
        v[i + half] = (x1 * c[i]) + (x0 * s[i]);
    }
}

/* The MoE combine in one pass: x[i] = x[i] + a_i, a_i = +0 then fma(w[r], y[r][i], a_i) for
 * r = 0..k-1 ascending (the accumulation stays in registers; each element gets the scalar
 * loop's operations). Each y row is prefetched a KiB ahead: the rows were just written by
 * the down projection, on either thread, and sit in some cache level. */
static inline void vec_combine(float *x, const float *const *y, const float *w, int k, int n) {
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int r = 0; r < k; r++) {
            const __m256 vw = _mm256_set1_ps(w[r]);
            const float *p = y[r] + i;
            _mm_prefetch((const char *)(p + 256), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 272), _MM_HINT_T0);
            a0 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(p), a0);
            a1 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(p + 8), a1);
            a2 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(p + 16), a2);
            a3 = _mm256_fmadd_ps(vw, _mm256_loadu_ps(p + 24), a3);
        }
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), a0));
        _mm256_storeu_ps(x + i + 8, _mm256_add_ps(_mm256_loadu_ps(x + i + 8), a1));
        _mm256_storeu_ps(x + i + 16, _mm256_add_ps(_mm256_loadu_ps(x + i + 16), a2));
        _mm256_storeu_ps(x + i + 24, _mm256_add_ps(_mm256_loadu_ps(x + i + 24), a3));
    }
    for (; i < n; i++) {
        float a = 0.0f;
        for (int r = 0; r < k; r++) a = fmaf(w[r], y[r][i], a);
        x[i] = x[i] + a;
    }
}

typedef void (*vec_swiglu_fn)(const float *g, const float *u, float *h, int n);

/* h[i] = mathx_silu(g[i]) * u[i] */
void vec_swiglu_generic(const float *g, const float *u, float *h, int n);
void vec_swiglu_avx2(const float *g, const float *u, float *h, int n);
void vec_swiglu_avx512(const float *g, const float *u, float *h, int n);
vec_swiglu_fn vec_swiglu_select(int cpu_level);

typedef void (*vec_rmsnorm_fn)(float *y, const float *x, const float *w, int n, float eps);

/* mathx_rmsnorm (32-lane sum of squares, r = 1/sqrt(ss/n + eps), y = (x*r)*w); y may alias x */
void vec_rmsnorm_generic(float *y, const float *x, const float *w, int n, float eps);
void vec_rmsnorm_avx2(float *y, const float *x, const float *w, int n, float eps);
void vec_rmsnorm_avx512(float *y, const float *x, const float *w, int n, float eps);
vec_rmsnorm_fn vec_rmsnorm_select(int cpu_level);

/* mathx_scan_max on 8 / 16 lanes (the attention kernels' inline forms, exported for their test) */
float vec_scan_max_avx2(const float *s, int n);
float vec_scan_max_avx512(const float *s, int n);

#endif
