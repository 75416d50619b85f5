/* gemm_job.h — one gemm call as a thread job, for the bench tools (bench_repack, ab_kernel). */
#ifndef DITTO_BENCH_GEMM_JOB_H
#define DITTO_BENCH_GEMM_JOB_H

#include <stddef.h>

#include "quant.h"

typedef struct {
    quant_gemm_fn fn;
    const void *w;
    size_t stride; /* row_bytes (row-major) or group_bytes (repacked) */
    int r0, r1, k;
    const void *act;
    size_t ab; /* bytes per activation row */
    int n_tok;
    float *out;
    size_t os; /* out_stride */
} gemm_job;

/* Runs the job at p (a gemm_job *); pthread-start signature. */
static inline void *gemm_job_run(void *p) {
    const gemm_job *j = p;
    j->fn(j->w, j->stride, j->r0, j->r1, j->k, j->act, j->ab, j->n_tok, j->out, j->os);
    return NULL;
}

#endif
