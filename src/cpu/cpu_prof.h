/* cpu_prof.h — the CPU backend's optional step profile: wall time, weight bytes and thread
 * spread per stage of a step, and the gemm kernel calls by tokens per call (backend_ops.profile,
 * backend_ops.calls). Off, every entry point but cpu_prof_init / cpu_prof_free is a no-op. */
#ifndef DITTO_CPU_PROF_H
#define DITTO_CPU_PROF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Stages of a step, in order. */
enum cpu_stage {
    CS_EMBED, CS_NORM, CS_QKV, CS_QK_ROPE, CS_ATTN, CS_ACT_ATT, CS_O, CS_FFN_IN, CS_ROUTER, CS_ROUTE,
    CS_GATE_UP, CS_SWIGLU, CS_DOWN, CS_COMBINE, CS_OUTPUT, CS_COUNT
};

/* Kinds of gemm kernel call: by tokens per call, the one-token calls split by whether their step
 * had one row. */
enum cpu_call_kind { CC_SOLO, CC_ONE, CC_TWO, CC_FEW, CC_MANY, CC_COUNT };
#define CC_STRIDE 16 /* a thread's counters apart (8-byte ones): no two threads' on one cache line */

typedef struct cpu_prof {
    bool on;
    int nth;
    double t0;             /* end of the last profiled stage */
    uint64_t b0;           /* the weight-byte counter then */
    double s[CS_COUNT];    /* seconds per stage, summed */
    uint64_t b[CS_COUNT];  /* weight bytes per stage, summed */
    double e[CS_COUNT];    /* last - first thread done per stage, summed */
    double ends;           /* the same since the last mark */
    double *fin;           /* [nth] when each thread ran out of gemm units */
    double *bar;           /* [n_bar][nth] when each thread reached a barrier */
    int step_rows;         /* rows of the step running (the calls' kinds) */
    double *call_s;        /* [nth][CC_STRIDE] kernel calls' seconds by kind */
    uint64_t *call_b;      /* [nth][CC_STRIDE] their weight bytes */
    uint64_t *call_n;      /* [nth][CC_STRIDE] their count */
} cpu_prof;

/* Sets p up for nth threads and n_bar barriers' times; on = profiling. Exits on out of memory. */
void cpu_prof_init(cpu_prof *p, bool on, int nth, int n_bar);
void cpu_prof_free(cpu_prof *p);
/* Starts a step's first stage now; weight_bytes: the backend's counter. */
void cpu_prof_start(cpu_prof *p, uint64_t weight_bytes);
/* Closes stage s: the time and the weight bytes (counter now minus at the previous mark) since then. */
void cpu_prof_mark(cpu_prof *p, enum cpu_stage s, uint64_t weight_bytes);
/* Adds the spread of t[0..n) (the last thread's time minus the first's) to the stage being timed. */
void cpu_prof_spread(cpu_prof *p, const double *t, int n);
/* Thread ith's kernel call of n_tok tokens over `bytes` weight bytes, begun at time t0. Each
 * thread writes only its own counters. */
void cpu_prof_call(cpu_prof *p, int ith, int n_tok, size_t bytes, double t0);
/* backend_ops.profile / backend_ops.calls: copy up to cap entries into out, return how many exist. */
int cpu_prof_stages(const cpu_prof *p, backend_stage *out, int cap);
int cpu_prof_calls(const cpu_prof *p, backend_calls *out, int cap);

#endif
