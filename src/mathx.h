/* mathx.h — the contract's own elementary functions and fixed-order reductions
 * (docs/arithmetic.md). Scalar reference versions; every SIMD/CUDA flavour must
 * reproduce them bit for bit. No libm: sqrtf compiles to the IEEE sqrt
 * instruction (-fno-math-errno), fmaf to the fma instruction (-mfma). */
#ifndef DITTO_MATHX_H
#define DITTO_MATHX_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#define MATHX_EXP_LO (-87.33654f) /* below: exp returns 0 */
#define MATHX_EXP_HI 88.0f        /* above: exp returns +inf */

/* exp(x): n = rint(x*log2e); r = x - n*ln2 (two fma steps, Cody-Waite);
 * e^r by a degree-5 polynomial (fma chain) * r^2 + r + 1; times 2^n by exponent bits. */
static inline float mathx_exp(float x) {
    if (x != x) return x;
    if (x < MATHX_EXP_LO) return 0.0f;
    if (x > MATHX_EXP_HI) return INFINITY;
    float n = quant_rint(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float z = r * r;
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float y = fmaf(p, z, r) + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return y * s;
}

static inline float mathx_silu(float x) { return x / (1.0f + mathx_exp(-x)); }

/* The contract's maximum: m = -inf; m = s[j] > m ? s[j] : m for j ascending (NaN is never
 * taken; a zero maximum keeps the sign of the first zero). */
static inline float mathx_scan_max(const float *s, int n) {
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = s[j] > m ? s[j] : m;
    return m;
}

/* Fixed butterfly over 32 lanes: +16, +8, +4, +2, +1. */
static inline float mathx_butterfly32(float *lane) {
    for (int s = 16; s >= 1; s >>= 1)
        for (int i = 0; i < s; i++) lane[i] = lane[i] + lane[i + s];
    return lane[0];
}

/* Sum of squares in the 32-lane order: lane[e%32] = fma(x_e, x_e, lane). */
static inline float mathx_sumsq32(const float *x, int n) {
    float lane[32] = {0};
    for (int e = 0; e < n; e++) lane[e & 31] = fmaf(x[e], x[e], lane[e & 31]);
    return mathx_butterfly32(lane);
}

/* Plain sum in the 32-lane order. */
static inline float mathx_sum32(const float *x, int n) {
    float lane[32] = {0};
    for (int e = 0; e < n; e++) lane[e & 31] = lane[e & 31] + x[e];
    return mathx_butterfly32(lane);
}

/* RMSNorm: r = 1/sqrt(ss/n + eps); y = (x*r)*w. y may alias x. */
static inline void mathx_rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
    float ss = mathx_sumsq32(x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) y[i] = (x[i] * r) * w[i];
}

/* Indices of the k largest of v[0..n) by (value desc, index asc): rank i is the first
 * index, among those not yet taken, whose value no other untaken one exceeds by '>' (this
 * definition also fixes what NaN does). */
static inline void mathx_topk_reference(const float *v, int n, int k, int32_t *sel) {
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n; e++) {
            int taken = 0;
            for (int j = 0; j < i; j++) taken |= sel[j] == e;
            if (taken) continue;
            if (best < 0 || v[e] > v[best]) best = e;
        }
        sel[i] = best;
    }
}

/* mathx_topk_reference in one pass when v has no NaN (insertion into the sorted top k;
 * equal values keep index order), else the reference itself. */
static inline void mathx_topk(const float *v, int n, int k, int32_t *sel) {
    int nan = 0;
    for (int e = 0; e < n; e++) nan |= v[e] != v[e];
    if (nan) {
        mathx_topk_reference(v, n, k, sel);
        return;
    }
    int cnt = 0;
    for (int e = 0; e < n; e++) {
        if (cnt == k && !(v[e] > v[sel[k - 1]])) continue;
        int at = cnt < k ? cnt++ : k - 1;
        while (at > 0 && v[e] > v[sel[at - 1]]) {
            sel[at] = sel[at - 1];
            at--;
        }
        sel[at] = e;
    }
}

#endif
