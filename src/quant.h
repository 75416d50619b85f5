/* quant.h — tensor block formats, activation formats and the per-type traits table.
 *
 * Every matmul against quantized weights follows the arithmetic contract
 * (../shared/docs/arithmetic.md, docs/arithmetic.md): activations are quantized
 * per token to 8 bits in blocks of 32 (legacy formats) or 256 (K-quants), each
 * (weight block x activation block) product is an exact int32, and one fp32
 * chain over blocks in ascending order accumulates them.
 *
 * The `_generic` kernels here are the scalar reference; src/cpu/quant_*.c hold
 * arch versions that must equal them bitwise (tests/test_quant.c). */
#ifndef DITTO_QUANT_H
#define DITTO_QUANT_H

#include <assert.h>
#include <stdbool.h>
#include <stdint.h>

#include "common.h"

/* ggml type ids as stored in GGUF. */
enum quant_type {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_BF16 = 30,
    QT_COUNT = 40
};

/* Which activation format a weight type is multiplied with. */
enum quant_act {
    QA_F32 = 0,  /* float activations, 32-lane fp32 dot (F32/F16/BF16 weights) */
    QA_Q8_32 = 1, /* block_q8a: 32 int8 + fp32 scale + int sum */
    QA_Q8_256 = 2 /* block_q8k: 256 int8 + fp32 scale + 16 sub-sums */
};

typedef uint16_t fp16_t;
typedef uint16_t bf16_t;

#define QK32 32
#define QK_K 256
#define K_SCALE_SIZE 12

/* ---- weight blocks -------------------------------------------------------
 *
 * Q4_0 (18 B / 32 weights)         w = d * (q - 8)
 *   +--------+----------------------------------+
 *   | d f16  | qs[16]: lo nibble = q[i], hi = q[i+16] |
 *   +--------+----------------------------------+ */
typedef struct {
    fp16_t d;
    uint8_t qs[QK32 / 2];
} block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");

/* Q4_1 (20 B / 32)                 w = d * q + m
 *   | d f16 | m f16 | qs[16] nibbles as Q4_0 | */
typedef struct {
    fp16_t d;
    fp16_t m;
    uint8_t qs[QK32 / 2];
} block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");

/* Q5_0 (22 B / 32)                 w = d * (q - 16), q = nibble | (bit << 4)
 *   | d f16 | qh[4]: bit i = 5th bit of q[i] | qs[16] nibbles as Q4_0 | */
typedef struct {
    fp16_t d;
    uint8_t qh[4];
    uint8_t qs[QK32 / 2];
} block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");

/* Q5_1 (24 B / 32)                 w = d * q + m
 *   | d f16 | m f16 | qh[4] | qs[16] | */
typedef struct {
    fp16_t d;
    fp16_t m;
    uint8_t qh[4];
    uint8_t qs[QK32 / 2];
} block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");

/* Q8_0 (34 B / 32)                 w = d * q
 *   | d f16 | qs[32] int8 | */
typedef struct {
    fp16_t d;
    int8_t qs[QK32];
} block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");

/* Q4_K (144 B / 256): 8 sub-blocks of 32, 6-bit scale and min each.
 *   | d f16 | dmin f16 | scales[12] | qs[128] |
 *   scales: sub-block j<4: sc = s[j]&63, m = s[j+4]&63;
 *           j>=4: sc = (s[j+4]&15) | ((s[j-4]>>6)<<4), m = (s[j+4]>>4) | ((s[j]>>6)<<4)
 *   qs: 4 groups of 32 bytes; group g holds sub-block 2g in low nibbles, 2g+1 in high.
 *   w = d*sc*q - dmin*m */
typedef struct {
    fp16_t d;
    fp16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");

/* Q5_K (176 B / 256): as Q4_K plus a 5th bit.
 *   | d f16 | dmin f16 | scales[12] | qh[32] | qs[128] |
 *   5th bit of element 32*j + l (sub-block j) = (qh[l] >> j) & 1. */
typedef struct {
    fp16_t d;
    fp16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");

/* Q6_K (210 B / 256): 16 sub-blocks of 16, int8 scales; q in [-32, 31].
 *   | ql[128] low 4 bits | qh[64] high 2 bits | scales[16] int8 | d f16 |
 *   For half h (128 elems), l in 0..31:
 *     q[l]    = (ql[l]    & 15) | ((qh[l] >> 0) & 3) << 4
 *     q[l+32] = (ql[l+32] & 15) | ((qh[l] >> 2) & 3) << 4
 *     q[l+64] = (ql[l]    >> 4) | ((qh[l] >> 4) & 3) << 4
 *     q[l+96] = (ql[l+32] >> 4) | ((qh[l] >> 6) & 3) << 4     (minus 32)
 *   with ql, qh advanced by 64 and 32 per half. w = d * scales[i/16] * q */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    fp16_t d;
} block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");

/* ---- activation blocks ---------------------------------------------------
 *
 * block_q8a (40 B / 32 activations): x ~= d * q
 *   | d f32 | s int32 = sum(q) | q[32] int8 |  */
typedef struct {
    float d;
    int32_t s;
    int8_t q[QK32];
} block_q8a;
static_assert(sizeof(block_q8a) == 40, "block_q8a size");

/* block_q8k (292 B / 256 activations): x ~= d * q
 *   | d f32 | q[256] int8 | bsums[16] int16: sum of q over each 16 |  */
typedef struct {
    float d;
    int8_t q[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8k;
static_assert(sizeof(block_q8k) == 292, "block_q8k size");

/* ---- traits --------------------------------------------------------------- */

/* out[t * out_stride + r] = dot(weight row r, activation row t) for r in [r0, r1),
 * t in [0, n_tok). w: row-major rows of `row_bytes`; act: n_tok rows of
 * `act_bytes` in the type's activation format (float for QA_F32); k: row length. */
typedef void (*quant_gemm_fn)(const void *w, size_t row_bytes, int r0, int r1, int k,
                              const void *act, size_t act_bytes, int n_tok, float *out,
                              size_t out_stride);

typedef struct quant_traits {
    const char *name;
    uint32_t blck;        /* weights per block */
    uint32_t bytes;       /* bytes per block */
    bool supported;       /* has dequant + gemm */
    enum quant_act act;
    void (*dequant_row)(const void *src, float *dst, int64_t k);
    quant_gemm_fn gemm;   /* scalar reference */
} quant_traits;

/* Traits of a ggml type id, or NULL for an id ditto does not know at all. */
const quant_traits *quant_traits_of(uint32_t type);
/* F32, F16 and BF16: the float types, row-major with float activations (the router). */
static inline bool quant_type_is_float(uint32_t type) { return type == QT_F32 || type == QT_F16 || type == QT_BF16; }
/* Bytes of one row of k weights (k must be a multiple of blck). */
size_t quant_row_bytes(uint32_t type, int64_t k);
/* Bytes of one activation row of length k for a weight type. */
size_t quant_act_bytes(enum quant_act act, int64_t k);
/* Quantize one activation row (contract: per-block amax/127, round half to even). */
void quant_act_row(enum quant_act act, const float *x, void *dst, int64_t k);

float fp16_to_f32(fp16_t h);
fp16_t f32_to_fp16(float f); /* round to nearest even */
float bf16_to_f32(bf16_t h);

/* Round to nearest, ties to even, for |x| < 2^22 — pure fp arithmetic, no libm. */
static inline float quant_rint(float x) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    return (x + magic) - magic; /* exact without -ffast-math (no reassociation) */
}

/* Q4_K / Q5_K 6-bit scale and min of sub-block j. */
static inline void quant_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
