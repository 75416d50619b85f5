/* vec.h — elementwise kernels with SIMD flavours bitwise equal to the scalar form. */
#ifndef DITTO_VEC_H
#define DITTO_VEC_H

typedef void (*vec_swiglu_fn)(const float *g, const float *u, float *h, int n);

/* h[i] = mathx_silu(g[i]) * u[i] */
void vec_swiglu_generic(const float *g, const float *u, float *h, int n);
void vec_swiglu_avx512(const float *g, const float *u, float *h, int n);
vec_swiglu_fn vec_swiglu_select(int cpu_level);

#endif
