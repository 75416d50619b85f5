/* attn.h — one query head of attention over a slot's positions [0, pos], by the
 * contract's chunked softmax (docs/arithmetic.md), reading K in the arena's
 * position-interleaved layout (kv.h) and V row by row. Every flavour is bitwise
 * equal to attn_head_generic (tests/test_attn.c). */
#ifndef DITTO_ATTN_H
#define DITTO_ATTN_H

#include "kv.h"

#define ATTN_CHUNK 64 /* keys per softmax chunk, at absolute positions [cC, (c+1)C) */

/* out[hd] = attention of q[hd] over positions 0..pos (the reference flavour).
 * scratch: pos+1 + 2*hd floats (64-byte aligned). */
void attn_head_generic(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                       float *scratch);

/* out[g][hd] = attention of q[g][hd], for the ng query heads g that share the KV head
 * (K, V), over positions 0..pos; each head's result is bitwise that of attn_head_generic.
 * scratch: attn_scratch_floats(ng, pos, hd) floats, 64-byte aligned. */
typedef void (*attn_fn)(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                        float *out, float *scratch);
void attn_group_generic(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                        float *out, float *scratch);
void attn_group_avx2(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                     float *out, float *scratch);
void attn_group_avx512(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                       float *out, float *scratch);
static inline size_t attn_scratch_floats(int ng, int pos, int hd) {
    size_t n16 = ((size_t)pos + 16) & ~(size_t)15;
    return (size_t)(ng < 8 ? ng : 8) * n16 + 2 * (size_t)hd + 16;
}
/* Best flavour for a CPU level (enum cpu_level) and head dimension. */
attn_fn attn_select(int cpu_level, int hd);

#endif
