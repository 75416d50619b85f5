/* sampler.h — per-stream token selection. Greedy is argmax with ties to the
 * lowest id. Random sampling draws one uniform number per position from a
 * counter-based RNG keyed by (seed, position), so a stream's choices depend on
 * nothing but its own logits, seed and position — never on batch company. */
#ifndef DITTO_SAMPLER_H
#define DITTO_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef struct sampler_params {
    float temperature; /* 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* 1: off */
    float min_p;       /* 0: off */
    uint64_t seed;
} sampler_params;

void sampler_params_default(sampler_params *p);

/* Uniform double in [0, 1) for (seed, position): splitmix64 of the pair. */
double sampler_uniform(uint64_t seed, int64_t position);

/* Chooses a token from logits[n_vocab] for absolute position `position`.
 * scratch must hold sampler_scratch_bytes(n_vocab) bytes, suitably aligned for float. */
int32_t sampler_sample(const sampler_params *p, const float *logits, int n_vocab, int64_t position, void *scratch);
size_t sampler_scratch_bytes(int n_vocab);

/* Argmax, ties to the lowest id. */
int32_t sampler_argmax(const float *logits, int n_vocab);

#endif
