/* engine.h — one model session: weights, the KV arena and a backend; runs
 * forward steps over validated batches. */
#ifndef DITTO_ENGINE_H
#define DITTO_ENGINE_H

#include <stdbool.h>

#include "backend.h"
#include "kv.h"
#include "model.h"

typedef struct engine_opts {
    int n_threads;     /* CPU worker threads (>= 1) */
    int max_streams;   /* KV slots */
    int ctx;           /* per-slot context cap (positions) */
    int max_rows;      /* rows per forward step (prefill chunk + decoders) */
    int cpu_level;     /* -1: best detected */
    int cpu_stream;    /* -1: this host's form (cpu/cpu_quant.h, cpu_stream_detect) */
    long cpu_ahead;    /* -1: the default (cpu/prefetch.h, CPU_AHEAD_BYTES) */
    int cpu_one_job;   /* a solo step as one pool job with barriers where the model allows: 1 on, 0 off, -1 where the host streams plain, at up to 8 threads */
    int cpu_claim_runs; /* -1: the default (cpu/claim.h, CLAIM_RUNS) */
    int cpu_float_form; /* -1: the float (router) kernels' one-token form follows cpu_stream's */
    bool unify;        /* route lone decode rows through the batched path too */
    bool profile;      /* per-stage step timings (backend_ops.profile), for ditto bench */
    bool cpu_loads_only; /* diagnostic, ditto bench only: gemm calls only load their weights (backend_opts) */
} engine_opts;

typedef struct engine {
    model *m;
    kv_arena *kv;
    const backend_ops *be;
    void *be_state;
    engine_opts opts;
    float *logits;     /* [max_rows][n_vocab] */
    uint64_t n_solo, n_batched; /* forward calls per path */
} engine;

void engine_opts_default(engine_opts *o);
/* Builds the arena (key: model, max_streams, geometry) and backend for m (not owned). */
int engine_create(engine **out, model *m, const engine_opts *o, ditto_err *err);
/* Applies o's run-time choices (unify, the backend's forms and tuning: backend_ops.retune) to a
 * live engine between forward calls; the arena (max_streams, ctx) and the backend's shape stay. */
int engine_retune(engine *e, const engine_opts *o, ditto_err *err);
void engine_free(engine *e);

/* Validates the batch (token ids, slots owned, each slot's rows at consecutive
 * positions starting at its current length, within ctx), runs it, advances
 * slot lengths. Returns the number of logits rows (in e->logits, batch order of
 * want_logits rows), or -1 with err. */
int engine_forward(engine *e, const engine_batch *b, ditto_err *err);

/* Runs fn(ctx, ith, nth) on the backend's host threads (nth = engine_host_threads), or on
 * the caller alone (nth 1); between forward calls only (the step thread's sampling). */
void engine_parallel(engine *e, void (*fn)(void *ctx, int ith, int nth), void *ctx);
int engine_host_threads(const engine *e);

/* 64-bit FNV-1a over the bytes of n floats (logits hashes). */
uint64_t engine_hash_floats(const float *x, size_t n);

#endif
