/* quant.c — scalar reference for every block format: dequantization, activation
 * quantization and the canonical quantized dot product (docs/arithmetic.md). */
#include "quant.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* ---- fp16 / bf16 ------------------------------------------------------------ */

float fp16_to_f32(fp16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0) {
        if (man == 0) return bits_f32(sign);
        /* subnormal: normalise */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400));
        man &= 0x3FF;
        return bits_f32(sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13));
    }
    if (exp == 31) return bits_f32(sign | 0x7F800000u | (man << 13));
    return bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

fp16_t f32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t exp = (x >> 23) & 0xFF;
    uint32_t man = x & 0x7FFFFF;
    if (exp == 0xFF) return (fp16_t)(sign | 0x7C00 | (man ? 0x200 : 0));
    int32_t e = (int32_t)exp - 127 + 15;
    if (e >= 31) return (fp16_t)(sign | 0x7C00);
    if (e <= 0) {
        if (e < -10) return (fp16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t h = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1))) h++;
        return (fp16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13);
    uint32_t rem = man & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exponent: correct */
    return (fp16_t)(sign | h);
}

float bf16_to_f32(bf16_t h) { return bits_f32((uint32_t)h << 16); }

/* ---- dequantization ----------------------------------------------------------- */

static void dequant_f32(const void *src, float *dst, int64_t k) { memcpy(dst, src, (size_t)k * 4); }
static void dequant_f16(const void *src, float *dst, int64_t k) {
    const fp16_t *s = src;
    for (int64_t i = 0; i < k; i++) dst[i] = fp16_to_f32(s[i]);
}
static void dequant_bf16(const void *src, float *dst, int64_t k) {
    const bf16_t *s = src;
    for (int64_t i = 0; i < k; i++) dst[i] = bf16_to_f32(s[i]);
}

/* 32 4-bit values of a legacy block: lo nibbles are elements 0..15, hi 16..31. */
static inline void nibbles32(const uint8_t *qs, int *q) {
    for (int i = 0; i < 16; i++) {
        q[i] = qs[i] & 0xF;
        q[i + 16] = qs[i] >> 4;
    }
}
static inline void add_high_bit(const uint8_t *qh, int *q) {
    uint32_t h;
    memcpy(&h, qh, 4);
    for (int i = 0; i < 32; i++) q[i] |= (int)((h >> i) & 1) << 4;
}

static void dequant_q4_0(const void *src, float *dst, int64_t k) {
    const block_q4_0 *b = src;
    int q[32];
    for (int64_t i = 0; i < k / QK32; i++) {
        float d = fp16_to_f32(b[i].d);
        nibbles32(b[i].qs, q);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)(q[j] - 8);
    }
}
static void dequant_q4_1(const void *src, float *dst, int64_t k) {
    const block_q4_1 *b = src;
    int q[32];
    for (int64_t i = 0; i < k / QK32; i++) {
        float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
        nibbles32(b[i].qs, q);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)q[j] + m;
    }
}
static void dequant_q5_0(const void *src, float *dst, int64_t k) {
    const block_q5_0 *b = src;
    int q[32];
    for (int64_t i = 0; i < k / QK32; i++) {
        float d = fp16_to_f32(b[i].d);
        nibbles32(b[i].qs, q);
        add_high_bit(b[i].qh, q);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)(q[j] - 16);
    }
}
static void dequant_q5_1(const void *src, float *dst, int64_t k) {
    const block_q5_1 *b = src;
    int q[32];
    for (int64_t i = 0; i < k / QK32; i++) {
        float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
        nibbles32(b[i].qs, q);
        add_high_bit(b[i].qh, q);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)q[j] + m;
    }
}
static void dequant_q8_0(const void *src, float *dst, int64_t k) {
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < k / QK32; i++) {
        float d = fp16_to_f32(b[i].d);
        for (int j = 0; j < 32; j++) dst[i * 32 + j] = d * (float)b[i].qs[j];
    }
}

/* Unpacks the 256 quants of a Q4_K / Q5_K block (0..15 or 0..31). */
static void unpack_q4k(const block_q4_K *b, int *q) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = b->qs[32 * g + l] & 0xF;
            q[64 * g + 32 + l] = b->qs[32 * g + l] >> 4;
        }
}
static void unpack_q5k(const block_q5_K *b, int *q) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = b->qs[32 * g + l] & 0xF;
            q[64 * g + 32 + l] = b->qs[32 * g + l] >> 4;
        }
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 32; l++) q[32 * j + l] |= ((b->qh[l] >> j) & 1) << 4;
}
/* Q6_K quants, already minus 32 (range -32..31). */
static void unpack_q6k(const block_q6_K *b, int *q) {
    const uint8_t *ql = b->ql, *qh = b->qh;
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            int *o = q + 128 * h;
            o[l] = (int)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            o[l + 32] = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            o[l + 64] = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            o[l + 96] = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        }
        ql += 64;
        qh += 32;
    }
}

static void dequant_q4_K(const void *src, float *dst, int64_t k) {
    const block_q4_K *b = src;
    int q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++) {
        float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
        unpack_q4k(&b[i], q);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_k_scale_min(j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) dst[i * QK_K + 32 * j + l] = d1 * (float)q[32 * j + l] - m1;
        }
    }
}
static void dequant_q5_K(const void *src, float *dst, int64_t k) {
    const block_q5_K *b = src;
    int q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++) {
        float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
        unpack_q5k(&b[i], q);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_k_scale_min(j, b[i].scales, &sc, &m);
            float d1 = d * (float)sc, m1 = dmin * (float)m;
            for (int l = 0; l < 32; l++) dst[i * QK_K + 32 * j + l] = d1 * (float)q[32 * j + l] - m1;
        }
    }
}
static void dequant_q6_K(const void *src, float *dst, int64_t k) {
    const block_q6_K *b = src;
    int q[QK_K];
    for (int64_t i = 0; i < k / QK_K; i++) {
        float d = fp16_to_f32(b[i].d);
        unpack_q6k(&b[i], q);
        for (int j = 0; j < QK_K; j++) dst[i * QK_K + j] = d * (float)b[i].scales[j / 16] * (float)q[j];
    }
}

/* ---- activation quantization ------------------------------------------------------ */

/* One block of n values: d = amax/127 (IEEE division), q = clamp(rint(x/d)). */
static float quant_block(const float *x, int n, int8_t *q) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = x[i] < 0 ? -x[i] : x[i];
        if (a > amax) amax = a;
    }
    float d = amax / 127.0f;
    /* zero block, scale underflow, infinite max: all-zero quants (also defined for NaN input) */
    if (amax == 0.0f || d == 0.0f || !(amax <= FLT_MAX)) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    for (int i = 0; i < n; i++) {
        float v = x[i] / d;
        if (v != v) v = 0.0f;
        v = quant_rint(v);
        if (v > 127.0f) v = 127.0f;
        if (v < -127.0f) v = -127.0f;
        q[i] = (int8_t)v;
    }
    return d;
}

void quant_act_row(enum quant_act act, const float *x, void *dst, int64_t k) {
    if (act == QA_F32) {
        memcpy(dst, x, (size_t)k * 4);
    } else if (act == QA_Q8_32) {
        block_q8a *b = dst;
        for (int64_t i = 0; i < k / QK32; i++) {
            b[i].d = quant_block(x + i * QK32, QK32, b[i].q);
            int32_t s = 0;
            for (int j = 0; j < QK32; j++) s += b[i].q[j];
            b[i].s = s;
        }
    } else {
        block_q8k *b = dst;
        for (int64_t i = 0; i < k / QK_K; i++) {
            b[i].d = quant_block(x + i * QK_K, QK_K, b[i].q);
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int l = 0; l < 16; l++) s += b[i].q[16 * j + l];
                b[i].bsums[j] = (int16_t)s;
            }
        }
    }
}

size_t quant_act_bytes(enum quant_act act, int64_t k) {
    if (act == QA_F32) return (size_t)k * 4;
    if (act == QA_Q8_32) return (size_t)(k / QK32) * sizeof(block_q8a);
    return (size_t)(k / QK_K) * sizeof(block_q8k);
}

/* ---- canonical dot products (one row x one activation row) ----------------------------- */

/* 32-lane fp32 order: element e into lane e%32, then butterfly +16,+8,+4,+2,+1. */
static float dot_lanes(const float *w, const float *x, int k) {
    float lane[32] = {0};
    for (int e = 0; e < k; e++) lane[e % 32] = fmaf(w[e], x[e], lane[e % 32]);
    for (int s = 16; s >= 1; s >>= 1)
        for (int i = 0; i < s; i++) lane[i] = lane[i] + lane[i + s];
    return lane[0];
}

static float dot_f32(const void *w, const void *a, int k) { return dot_lanes(w, a, k); }
static float dot_f16(const void *w, const void *a, int k) {
    const fp16_t *s = w;
    const float *x = a;
    float lane[32] = {0};
    for (int e = 0; e < k; e++) lane[e % 32] = fmaf(fp16_to_f32(s[e]), x[e], lane[e % 32]);
    for (int s2 = 16; s2 >= 1; s2 >>= 1)
        for (int i = 0; i < s2; i++) lane[i] = lane[i] + lane[i + s2];
    return lane[0];
}
static float dot_bf16(const void *w, const void *a, int k) {
    const bf16_t *s = w;
    const float *x = a;
    float lane[32] = {0};
    for (int e = 0; e < k; e++) lane[e % 32] = fmaf(bf16_to_f32(s[e]), x[e], lane[e % 32]);
    for (int s2 = 16; s2 >= 1; s2 >>= 1)
        for (int i = 0; i < s2; i++) lane[i] = lane[i] + lane[i + s2];
    return lane[0];
}

static inline int32_t isum32(const int *q, int off, const int8_t *a) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (q[i] - off) * a[i];
    return s;
}

static float dot_q4_0(const void *w, const void *a, int k) {
    const block_q4_0 *b = w;
    const block_q8a *y = a;
    float acc = 0.0f;
    int q[32];
    for (int i = 0; i < k / QK32; i++) {
        nibbles32(b[i].qs, q);
        int32_t I = isum32(q, 8, y[i].q);
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
    }
    return acc;
}
static float dot_q4_1(const void *w, const void *a, int k) {
    const block_q4_1 *b = w;
    const block_q8a *y = a;
    float acc = 0.0f;
    int q[32];
    for (int i = 0; i < k / QK32; i++) {
        nibbles32(b[i].qs, q);
        int32_t I = isum32(q, 0, y[i].q);
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
        acc = fmaf(fp16_to_f32(b[i].m) * y[i].d, (float)y[i].s, acc);
    }
    return acc;
}
static float dot_q5_0(const void *w, const void *a, int k) {
    const block_q5_0 *b = w;
    const block_q8a *y = a;
    float acc = 0.0f;
    int q[32];
    for (int i = 0; i < k / QK32; i++) {
        nibbles32(b[i].qs, q);
        add_high_bit(b[i].qh, q);
        int32_t I = isum32(q, 16, y[i].q);
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
    }
    return acc;
}
static float dot_q5_1(const void *w, const void *a, int k) {
    const block_q5_1 *b = w;
    const block_q8a *y = a;
    float acc = 0.0f;
    int q[32];
    for (int i = 0; i < k / QK32; i++) {
        nibbles32(b[i].qs, q);
        add_high_bit(b[i].qh, q);
        int32_t I = isum32(q, 0, y[i].q);
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
        acc = fmaf(fp16_to_f32(b[i].m) * y[i].d, (float)y[i].s, acc);
    }
    return acc;
}
static float dot_q8_0(const void *w, const void *a, int k) {
    const block_q8_0 *b = w;
    const block_q8a *y = a;
    float acc = 0.0f;
    for (int i = 0; i < k / QK32; i++) {
        int32_t I = 0;
        for (int j = 0; j < 32; j++) I += b[i].qs[j] * y[i].q[j];
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
    }
    return acc;
}

/* K-quants with 8 sub-blocks of 32 and 6-bit scale/min: I = sum_j sc_j * dot_j,
 * M = sum_j m_j * (sum of activation q over sub-block j). */
static float dot_kq_common(const int *q, const uint8_t *scales, fp16_t dw, fp16_t dminw,
                           const block_q8k *y, float acc) {
    int32_t I = 0, M = 0;
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        quant_k_scale_min(j, scales, &sc, &m);
        int32_t s = 0;
        for (int l = 0; l < 32; l++) s += q[32 * j + l] * y->q[32 * j + l];
        I += (int32_t)sc * s;
        M += (int32_t)m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
    }
    acc = fmaf(fp16_to_f32(dw) * y->d, (float)I, acc);
    acc = fmaf(-(fp16_to_f32(dminw) * y->d), (float)M, acc);
    return acc;
}
static float dot_q4_K(const void *w, const void *a, int k) {
    const block_q4_K *b = w;
    const block_q8k *y = a;
    float acc = 0.0f;
    int q[QK_K];
    for (int i = 0; i < k / QK_K; i++) {
        unpack_q4k(&b[i], q);
        acc = dot_kq_common(q, b[i].scales, b[i].d, b[i].dmin, &y[i], acc);
    }
    return acc;
}
static float dot_q5_K(const void *w, const void *a, int k) {
    const block_q5_K *b = w;
    const block_q8k *y = a;
    float acc = 0.0f;
    int q[QK_K];
    for (int i = 0; i < k / QK_K; i++) {
        unpack_q5k(&b[i], q);
        acc = dot_kq_common(q, b[i].scales, b[i].d, b[i].dmin, &y[i], acc);
    }
    return acc;
}
static float dot_q6_K(const void *w, const void *a, int k) {
    const block_q6_K *b = w;
    const block_q8k *y = a;
    float acc = 0.0f;
    int q[QK_K];
    for (int i = 0; i < k / QK_K; i++) {
        unpack_q6k(&b[i], q);
        int32_t I = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) s += q[16 * j + l] * y[i].q[16 * j + l];
            I += (int32_t)b[i].scales[j] * s;
        }
        acc = fmaf(fp16_to_f32(b[i].d) * y[i].d, (float)I, acc);
    }
    return acc;
}

#define GEMM_GENERIC(NAME, DOT)                                                                \
    static void NAME(const void *w, size_t row_bytes, int r0, int r1, int k, const void *act,  \
                     size_t act_bytes, int n_tok, float *out, size_t out_stride) {             \
        for (int t = 0; t < n_tok; t++)                                                        \
            for (int r = r0; r < r1; r++)                                                      \
                out[(size_t)t * out_stride + (size_t)r] =                                      \
                    DOT((const uint8_t *)w + (size_t)r * row_bytes,                            \
                        (const uint8_t *)act + (size_t)t * act_bytes, k);                      \
    }

GEMM_GENERIC(gemm_f32_generic, dot_f32)
GEMM_GENERIC(gemm_f16_generic, dot_f16)
GEMM_GENERIC(gemm_bf16_generic, dot_bf16)
GEMM_GENERIC(gemm_q4_0_generic, dot_q4_0)
GEMM_GENERIC(gemm_q4_1_generic, dot_q4_1)
GEMM_GENERIC(gemm_q5_0_generic, dot_q5_0)
GEMM_GENERIC(gemm_q5_1_generic, dot_q5_1)
GEMM_GENERIC(gemm_q8_0_generic, dot_q8_0)
GEMM_GENERIC(gemm_q4_K_generic, dot_q4_K)
GEMM_GENERIC(gemm_q5_K_generic, dot_q5_K)
GEMM_GENERIC(gemm_q6_K_generic, dot_q6_K)

/* ---- traits table ------------------------------------------------------------------ */

static const quant_traits traits[QT_COUNT] = {
    [QT_F32] = {"F32", 1, 4, true, QA_F32, dequant_f32, gemm_f32_generic},
    [QT_F16] = {"F16", 1, 2, true, QA_F32, dequant_f16, gemm_f16_generic},
    [QT_BF16] = {"BF16", 1, 2, true, QA_F32, dequant_bf16, gemm_bf16_generic},
    [QT_Q4_0] = {"Q4_0", 32, 18, true, QA_Q8_32, dequant_q4_0, gemm_q4_0_generic},
    [QT_Q4_1] = {"Q4_1", 32, 20, true, QA_Q8_32, dequant_q4_1, gemm_q4_1_generic},
    [QT_Q5_0] = {"Q5_0", 32, 22, true, QA_Q8_32, dequant_q5_0, gemm_q5_0_generic},
    [QT_Q5_1] = {"Q5_1", 32, 24, true, QA_Q8_32, dequant_q5_1, gemm_q5_1_generic},
    [QT_Q8_0] = {"Q8_0", 32, 34, true, QA_Q8_32, dequant_q8_0, gemm_q8_0_generic},
    [QT_Q4_K] = {"Q4_K", 256, 144, true, QA_Q8_256, dequant_q4_K, gemm_q4_K_generic},
    [QT_Q5_K] = {"Q5_K", 256, 176, true, QA_Q8_256, dequant_q5_K, gemm_q5_K_generic},
    [QT_Q6_K] = {"Q6_K", 256, 210, true, QA_Q8_256, dequant_q6_K, gemm_q6_K_generic},
    /* known to GGUF but not computed by ditto: sizes let the loader validate files */
    [9] = {"Q8_1", 32, 36, false, QA_F32, NULL, NULL},
    [10] = {"Q2_K", 256, 84, false, QA_F32, NULL, NULL},
    [11] = {"Q3_K", 256, 110, false, QA_F32, NULL, NULL},
    [15] = {"Q8_K", 256, 292, false, QA_F32, NULL, NULL},
    [24] = {"I8", 1, 1, false, QA_F32, NULL, NULL},
    [25] = {"I16", 1, 2, false, QA_F32, NULL, NULL},
    [26] = {"I32", 1, 4, false, QA_F32, NULL, NULL},
    [27] = {"I64", 1, 8, false, QA_F32, NULL, NULL},
    [28] = {"F64", 1, 8, false, QA_F32, NULL, NULL},
};

const quant_traits *quant_traits_of(uint32_t type) {
    if (type >= QT_COUNT || traits[type].name == NULL) return NULL;
    return &traits[type];
}

size_t quant_row_bytes(uint32_t type, int64_t k) {
    const quant_traits *t = quant_traits_of(type);
    DT_ASSERT(t && k % t->blck == 0);
    return (size_t)(k / t->blck) * t->bytes;
}
