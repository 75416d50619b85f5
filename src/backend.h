/* backend.h — the compute backend vtable. Its unit is the batch: one call runs
 * one forward step over rows of (token, position, slot); prefill chunks and
 * decode rows of many streams mix freely. */
#ifndef DITTO_BACKEND_H
#define DITTO_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "kv.h"
#include "model.h"

typedef struct engine_batch {
    int n;                      /* rows */
    const int32_t *token;       /* [n] token ids */
    const int32_t *pos;         /* [n] absolute positions */
    const int32_t *slot;        /* [n] KV slots; a slot's rows hold consecutive positions */
    const uint8_t *want_logits; /* [n] nonzero: return this row's logits */
} engine_batch;

typedef struct backend_opts {
    int n_threads;
    int max_rows;   /* most rows one forward call may carry */
    int cpu_level;  /* CPU kernels: -1 = best detected (enum cpu_level otherwise) */
    int cpu_stream; /* one-token kernels' weight stream form: -1 = this host's (enum cpu_stream otherwise) */
    long cpu_ahead; /* bytes of the next gemm stage a waiting CPU thread requests: -1 = CPU_AHEAD_BYTES */
    int cpu_one_job; /* a solo step as one pool job (cpu_backend.c, solo_task) where it fits: 1 on, 0 off, -1 host default */
    int cpu_claim_runs; /* a claimed run's cap, 1 / runs of a thread's segment: -1 = CLAIM_RUNS (cpu/claim.h) */
    int cpu_float_form; /* the float kernels' one-token form (the f32 router): -1 = cpu_stream's (enum cpu_stream otherwise) */
    bool profile;   /* time every stage of the step (see backend_ops.profile) */
    bool cpu_loads_only; /* diagnostic (ditto bench --loads-only-ab): every gemm call only loads its weight
                          * bytes and writes made-up outputs; the results are not the model's */
} backend_opts;

/* Wall time and weight bytes of one stage of the step, summed over all forward calls. */
typedef struct backend_stage {
    const char *name;
    double seconds;
    uint64_t weight_bytes;
    double ends; /* of seconds: from the first thread done with the stage's gemm work to the last */
} backend_stage;

/* Gemm kernel calls of one kind (e.g. "2 tokens"), summed over threads and forward calls. */
typedef struct backend_calls {
    const char *name;
    double thread_seconds; /* inside the kernel calls, summed over the threads */
    uint64_t weight_bytes; /* of the calls' rows, in the model's format */
    uint64_t calls;
} backend_calls;

typedef struct backend_ops {
    const char *name;
    int (*create)(void **state, model *m, kv_arena *kv, const backend_opts *o, ditto_err *err);
    /* Applies o's run-time choices (the CPU's stream forms, requests ahead, claimed runs, solo step
     * form, loads-only diagnostic) to a live state between forward calls; n_threads, max_rows,
     * cpu_level and profile must be the created ones (else an error naming the field). Results stay
     * bitwise the same (the loads-only diagnostic aside). */
    int (*retune)(void *state, const backend_opts *o, ditto_err *err);
    /* Writes K/V for every row into kv, then one logits row of n_vocab floats per
     * want_logits row, in batch order. The batch is already validated. */
    /* solo: the batch is one decode row of a lone stream, run on the matrix-vector
     * path (no expert grouping, no gathers); results are bitwise equal either way. */
    void (*forward)(void *state, const engine_batch *b, bool solo, float *logits);
    /* Bytes of weights and of KV read by all forward calls so far. */
    void (*counters)(void *state, uint64_t *weight_bytes, uint64_t *kv_bytes);
    /* Copies up to cap per-stage totals (zero unless created with profile) into out;
     * returns the number of stages. */
    int (*profile)(void *state, backend_stage *out, int cap);
    /* Copies up to cap kinds of gemm kernel call (zero unless created with profile) into out;
     * returns the number of kinds. */
    int (*calls)(void *state, backend_calls *out, int cap);
    /* Human-readable kernel choice, e.g. "cpu avx512, 2 threads". */
    const char *(*describe)(void *state);
    /* Human-readable memory the backend reads the model's weights from, into buf (cap bytes),
     * e.g. "weights prepared in memory 16341.8 MiB (100% on huge pages), token embedding copied 243.4 MiB"
     * (prepared: the quantized matrices repacked, the float router copied as it is). */
    void (*memory)(void *state, char *buf, size_t cap);
    /* Runs fn(ctx, ith, nth) once on each of the backend's nth host threads (ith = 0..nth-1) and
     * returns when all are done; between forward calls only. NULL where the backend has none. */
    void (*host_parallel)(void *state, void (*fn)(void *ctx, int ith, int nth), void *ctx);
    void (*destroy)(void *state);
} backend_ops;

extern const backend_ops cpu_backend_ops;

#endif
