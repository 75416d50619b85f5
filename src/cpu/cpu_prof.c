/* cpu_prof.c — the CPU backend's step profile (cpu_prof.h). */
#include "cpu/cpu_prof.h"

#include <stdlib.h>

#include "common.h"

_Static_assert(8 * CC_COUNT + 64 <= 8 * CC_STRIDE, "CC_STRIDE leaves a cache line between threads' counters");

static const char *const stage_names[CS_COUNT] = {
    "embed", "attn norm", "q/k/v gemm", "q/k norm, rope, kv store", "attention", "attn out quant",
    "o gemm", "residual + ffn norm", "router gemm", "routing top-k", "gate/up gemm (+ gather)",
    "swiglu", "down gemm", "combine", "out norm + output gemm"};
static const char *const call_names[CC_COUNT] = {"1 token, steps of one row", "1 token, steps of more rows",
                                                 "2 tokens", "3-8 tokens", "over 8 tokens"};

void cpu_prof_init(cpu_prof *p, bool on, int nth, int n_bar) {
    *p = (cpu_prof){.on = on, .nth = nth};
    p->fin = xcalloc((size_t)nth, sizeof(double));
    p->bar = xcalloc((size_t)n_bar * (size_t)nth, sizeof(double));
    p->call_s = xcalloc((size_t)nth * CC_STRIDE, sizeof(double));
    p->call_b = xcalloc((size_t)nth * CC_STRIDE, sizeof(uint64_t));
    p->call_n = xcalloc((size_t)nth * CC_STRIDE, sizeof(uint64_t));
}

void cpu_prof_free(cpu_prof *p) {
    free(p->fin);
    free(p->bar);
    free(p->call_s);
    free(p->call_b);
    free(p->call_n);
}

void cpu_prof_start(cpu_prof *p, uint64_t weight_bytes) {
    if (!p->on) return;
    p->t0 = time_now();
    p->b0 = weight_bytes;
}

void cpu_prof_mark(cpu_prof *p, enum cpu_stage s, uint64_t weight_bytes) {
    if (!p->on) return;
    const double t = time_now();
    p->s[s] += t - p->t0;
    p->b[s] += weight_bytes - p->b0;
    p->e[s] += p->ends;
    p->ends = 0;
    p->t0 = t;
    p->b0 = weight_bytes;
}

void cpu_prof_spread(cpu_prof *p, const double *t, int n) {
    if (!p->on) return;
    double lo = t[0], hi = lo;
    for (int i = 1; i < n; i++) lo = DT_MIN(lo, t[i]), hi = DT_MAX(hi, t[i]);
    p->ends += hi - lo;
}

void cpu_prof_call(cpu_prof *p, int ith, int n_tok, size_t bytes, double t0) {
    if (!p->on) return;
    const int k = n_tok == 1 ? (p->step_rows == 1 ? CC_SOLO : CC_ONE) : n_tok == 2 ? CC_TWO : n_tok <= 8 ? CC_FEW : CC_MANY;
    const size_t i = (size_t)ith * CC_STRIDE + (size_t)k;
    p->call_s[i] += time_now() - t0;
    p->call_b[i] += bytes;
    p->call_n[i]++;
}

int cpu_prof_stages(const cpu_prof *p, backend_stage *out, int cap) {
    for (int i = 0; i < CS_COUNT && i < cap; i++) out[i] = (backend_stage){stage_names[i], p->s[i], p->b[i], p->e[i]};
    return CS_COUNT;
}

int cpu_prof_calls(const cpu_prof *p, backend_calls *out, int cap) {
    for (int k = 0; k < CC_COUNT && k < cap; k++) {
        out[k] = (backend_calls){call_names[k], 0.0, 0, 0};
        for (int t = 0; t < p->nth; t++) {
            const size_t i = (size_t)t * CC_STRIDE + (size_t)k;
            out[k].thread_seconds += p->call_s[i];
            out[k].weight_bytes += p->call_b[i];
            out[k].calls += p->call_n[i];
        }
    }
    return CC_COUNT;
}
