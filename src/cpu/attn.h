/* attn.h — one query head of attention over a slot's positions [0, pos], by the
 * contract's chunked softmax (docs/arithmetic.md), reading K in the arena's
 * position-interleaved layout (kv.h) and V row by row. Every flavour is bitwise
 * equal to attn_head_generic (tests/test_attn.c). */
#ifndef DITTO_ATTN_H
#define DITTO_ATTN_H

#include "kv.h"

#define ATTN_CHUNK 64 /* keys per softmax chunk, at absolute positions [cC, (c+1)C) */

/* out[hd] = attention of q[hd] over positions 0..pos. scratch: pos+1 + 2*hd floats (64-byte aligned). */
typedef void (*attn_fn)(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                        float *scratch);

void attn_head_generic(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                       float *scratch);
void attn_head_avx512(const float *q, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale, float *out,
                      float *scratch);
/* Best flavour for a CPU level (enum cpu_level) and head dimension. */
attn_fn attn_select(int cpu_level, int hd);

#endif
