/* prepared.h — weights re-laid for the CPU kernels, built once per model and shared
 * by every CPU engine of that model (stored in model->prepared).
 *
 * Quantized matrices (every repack_supported type) are repacked into 16-row interleaved groups (cpu/repack.h)
 * so SIMD lanes are output rows; the repacked kernels are bitwise equal to the
 * reference on the original layout, so preparing changes speed, never results.
 * Float matrices that are streamed every step (the MoE router) are copied as they
 * are, for the huge pages. The original file pages are released after the copy.
 * Gate and up matrices of the same type and shape are interleaved, expert by expert (gate e,
 * up e, gate e+1, ...): a token's gate and up products of one expert are one stream. */
#ifndef DITTO_PREPARED_H
#define DITTO_PREPARED_H

#include <stdint.h>

#include "model.h"
#include "pool.h"

typedef struct prep_weight {
    const model_weight *w; /* the model's weight this replaces */
    const uint8_t *data;   /* prepared matrix 0; matrix e at data + e*mat_stride */
    size_t mat_bytes;      /* bytes per prepared matrix */
    size_t mat_stride;     /* bytes from one matrix to the next: mat_bytes, or 2*mat_bytes where
                              an expert's gate and up matrices are laid side by side */
    size_t group_bytes;    /* repacked: bytes per 16-row group (the gemm's row_bytes argument);
                              copied: the row bytes */
    int repacked;          /* 1: 16-row groups for the repacked kernels; 0: a plain copy */
} prep_weight;

typedef struct cpu_prepared cpu_prepared;

/* The model's prepared weights, built on first use with pool (env DITTO_REPACK=0: none). */
const cpu_prepared *cpu_prepared_get(model *m, pool *p);
/* The prepared form of w (repacked, or a plain copy: see prep_weight.repacked), or NULL
 * (use w as it is). */
const prep_weight *cpu_prepared_find(const cpu_prepared *cp, const model_weight *w);
/* Bytes of prepared weights (0 when none). */
size_t cpu_prepared_bytes(const cpu_prepared *cp);
/* Bytes of them on transparent huge pages now (the AnonHugePages of their mapping in
 * /proc/self/smaps; 0 where that cannot be read). */
size_t cpu_prepared_huge_bytes(const cpu_prepared *cp);

#endif
