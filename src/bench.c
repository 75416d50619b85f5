/* bench.c — throughput measurements with the engine (no scheduler in the timed
 * loop): prefill of one prompt, then decode steps with S streams in the batch. */
#include "bench.h"

#include <errno.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu/claim.h"
#include "cpu/prefetch.h"
#include "engine.h"
#include "pool.h"
#include "sampler.h"

typedef struct bw_ctx {
    const uint8_t *buf;
    size_t bytes;
    int streams; /* interleaved sequential streams per thread */
    int pf;      /* software prefetch: 0 none, 1 into L1 1 KiB ahead, 2 as the kernels (cpu/prefetch.h) */
    int form;    /* the one-token kernels' enum cpu_stream, for pf 2 */
    uint64_t sink[64];
} bw_ctx;

/* Reads this thread's share of buf as `streams` interleaved sequential streams, 128 bytes
 * per stream per step, with 256-bit loads and no software prefetch (the hardware's alone), or
 * 1 KiB ahead into L1, or as the one-token kernels prefetch in this host's stream form
 * (cpu_prefetch_line_form: cpu/prefetch.h; near-far's requests, as the multi-token kernels make
 * them, where that form is plain, which makes none). */
__attribute__((target("avx2"))) static void bw_task(void *ctx, int ith, int nth) {
    bw_ctx *c = ctx;
    size_t per = c->bytes / (size_t)nth, base = per * (size_t)ith;
    size_t steps = per / (size_t)c->streams / 128, span = steps * 128;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < steps; i++)
        for (int s = 0; s < c->streams; s++) {
            const uint8_t *q = c->buf + base + (size_t)s * span + i * 128;
            if (c->pf == 2 && c->form == CPU_STREAM_TWO_L1) {
                cpu_prefetch_line_form((const char *)q, CPU_STREAM_TWO_L1);
                cpu_prefetch_line_form((const char *)q + 64, CPU_STREAM_TWO_L1);
            } else if (c->pf == 2) {
                cpu_prefetch_line((const char *)q);
                cpu_prefetch_line((const char *)q + 64);
            } else if (c->pf == 1) {
                _mm_prefetch((const char *)q + 1024, _MM_HINT_T0);
                _mm_prefetch((const char *)q + 1088, _MM_HINT_T0);
            }
            const __m256i *p = (const __m256i *)q;
            a0 = _mm256_xor_si256(a0, _mm256_load_si256(p));
            a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + 1));
            a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + 2));
            a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + 3));
        }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    c->sink[ith % 64] = (uint64_t)_mm256_extract_epi64(a0, 0);
}

struct bench_probe {
    uint8_t *buf;
    size_t bytes;
    pool *pool;
    int form; /* enum cpu_stream */
};

bench_probe *bench_probe_create(int n_threads, size_t bytes) {
    /* on transparent huge pages where the kernel gives them, as the repacked weights are */
    const size_t huge = (size_t)2 << 20;
    bytes = (bytes + huge - 1) & ~(huge - 1);
    uint8_t *buf = aligned_alloc(huge, bytes);
    if (!buf) return NULL;
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    bench_probe *p = xcalloc(1, sizeof *p);
    p->buf = buf;
    p->bytes = bytes;
    p->pool = pool_create(n_threads);
    pool_set_spin(p->pool, 0.0); /* its workers must not spin on into what is measured next */
    p->form = cpu_stream_select(cpu_level_detect(), -1); /* as the backend picks it */
    return p;
}

/* Waits until the worker threads of the pool that ran last stop spinning (POOL_SPIN_S): on a
 * machine with no spare core they would take CPU time from what is measured next. */
static void quiesce(void) {
    const struct timespec ts = {0, (long)((POOL_SPIN_S + 0.0005) * 1e9)};
    nanosleep(&ts, NULL);
}

double bench_probe_run(bench_probe *p, int reps, double by_pattern[BENCH_PATTERNS]) {
    if (!p) return 0;
    quiesce();
    double best = 0, bp[BENCH_PATTERNS] = {0};
    for (int r = 0; r < reps; r++)
        for (int i = 0; i < BENCH_PATTERNS; i++) {
            bw_ctx c = {p->buf, p->bytes, 1 << (i / 3), i % 3, p->form, {0}};
            double t0 = time_now();
            pool_run(p->pool, bw_task, &c);
            double gb = (double)p->bytes / (time_now() - t0) / 1e9;
            bp[i] = DT_MAX(bp[i], gb);
            best = DT_MAX(best, gb);
        }
    if (by_pattern) memcpy(by_pattern, bp, sizeof bp);
    return best;
}

double bench_probe_stream(bench_probe *p, double bytes) {
    if (!p || bytes <= 0) return 0;
    quiesce();
    const size_t want = (size_t)bytes, quantum = (size_t)128 * 64; /* bw_task reads whole 128-byte steps a thread */
    size_t done = 0;
    const double t0 = time_now();
    while (done + quantum <= want) {
        bw_ctx c = {p->buf, DT_MIN(p->bytes, (want - done) / quantum * quantum), 1, 0, p->form, {0}};
        pool_run(p->pool, bw_task, &c);
        done += c.bytes;
    }
    return (double)done / (time_now() - t0) / 1e9;
}

/* Threads 0 and 1 of the probe's pool hand a counter back and forth through one cache line:
 * thread 0 writes 2i+1, thread 1 answers 2i+2, RTT_ROUNDS times; thread 0 times the rounds
 * after the first RTT_WARM (by then both run). No pause in the spins: each wait is one hop. */
#define RTT_ROUNDS 2000
#define RTT_WARM 200
typedef struct rtt_ctx {
    _Alignas(64) _Atomic unsigned v;
    double seconds; /* thread 0's, once the rounds are over */
} rtt_ctx;

static void rtt_task(void *ctx, int ith, int nth) {
    (void)nth;
    rtt_ctx *c = ctx;
    if (ith == 1)
        for (unsigned i = 0; i < RTT_ROUNDS; i++) {
            while (atomic_load_explicit(&c->v, memory_order_acquire) != 2 * i + 1) {}
            atomic_store_explicit(&c->v, 2 * i + 2, memory_order_release);
        }
    if (ith != 0) return;
    double t0 = 0;
    for (unsigned i = 0; i < RTT_ROUNDS; i++) {
        if (i == RTT_WARM) t0 = time_now();
        atomic_store_explicit(&c->v, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&c->v, memory_order_acquire) != 2 * i + 2) {}
    }
    c->seconds = time_now() - t0;
}

double bench_probe_rtt(bench_probe *p) {
    if (!p || pool_size(p->pool) < 2) return 0;
    quiesce();
    rtt_ctx c = {0};
    pool_run(p->pool, rtt_task, &c);
    return 1e9 * c.seconds / (RTT_ROUNDS - RTT_WARM);
}

void bench_probe_free(bench_probe *p) {
    if (!p) return;
    pool_free(p->pool);
    free(p->buf);
    free(p);
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    while (*s && n < cap) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static uint64_t xs(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Prefills `len` random tokens into slot (chunks of max_rows). Returns seconds. */
static double prefill(engine *e, int slot, int len, uint64_t *rng, int32_t *last, ditto_err *err) {
    int R = e->opts.max_rows, V = e->m->hp.n_vocab;
    int32_t *tok = xmalloc(sizeof(int32_t) * (size_t)R * 3);
    int32_t *pos = tok + R, *sl = tok + 2 * R;
    uint8_t *want = xcalloc((size_t)R, 1);
    double t0 = time_now();
    for (int done = 0; done < len;) {
        int c = DT_MIN(R, len - done);
        for (int r = 0; r < c; r++) {
            tok[r] = (int32_t)(xs(rng) % (uint64_t)DT_MIN(V, 50000));
            pos[r] = done + r;
            sl[r] = slot;
            want[r] = done + r == len - 1;
        }
        engine_batch b = {c, tok, pos, sl, want};
        if (engine_forward(e, &b, err) < 0) {
            free(tok);
            free(want);
            return -1;
        }
        done += c;
    }
    double dt = time_now() - t0;
    *last = sampler_argmax(e->logits, V);
    free(tok);
    free(want);
    return dt;
}

#define BENCH_STAGES 32
typedef struct bench_row {
    const char *label;
    int streams;
    double step_ms, agg, per_stream, wbytes, kvbytes, gbs;
    int n_stages;                      /* per-stage profile (engine created with profile) */
    backend_stage stage[BENCH_STAGES]; /* per decode step */
} bench_row;

/* Prefills n streams of plen random tokens, stream s from seed seed0 + s, each into a slot taken from
 * e's arena: sl[s], its next token tok[s] and position pos[s] = plen. Each slot taken adds one to
 * *held (the caller releases sl[0 .. *held), also when this fails). */
static int streams_prefill(engine *e, int n, int plen, uint64_t seed0, int32_t *tok, int32_t *pos, int32_t *sl,
                           int *held, ditto_err *err) {
    for (int s = 0; s < n; s++) {
        uint64_t rng = seed0 + (uint64_t)s;
        sl[s] = kv_slot_acquire(e->kv);
        DT_ASSERT(sl[s] >= 0);
        ++*held;
        pos[s] = plen;
        if (prefill(e, sl[s], plen, &rng, &tok[s], err) < 0) return -1;
    }
    return 0;
}

/* Releases the slots sl[0 .. held) that streams_prefill took from e's arena. */
static void streams_release(engine *e, const int32_t *sl, int held) {
    for (int s = 0; s < held; s++) kv_slot_release(e->kv, sl[s]);
}

/* S streams prefilled (untimed), then gen decode steps with all S rows. */
static int decode_run(engine *e, int S, int plen, int gen, uint64_t seed, bench_row *row, ditto_err *err) {
    int32_t tok[4096], pos[4096], sl[4096];
    uint8_t want[4096];
    uint64_t rng = seed;
    for (int s = 0; s < S; s++) {
        sl[s] = kv_slot_acquire(e->kv);
        if (prefill(e, sl[s], plen, &rng, &tok[s], err) < 0) return -1;
        pos[s] = plen;
        want[s] = 1;
    }
    uint64_t w0, k0, w1, k1;
    backend_stage p0[BENCH_STAGES], p1[BENCH_STAGES];
    int np = e->be->profile(e->be_state, p0, BENCH_STAGES);
    e->be->counters(e->be_state, &w0, &k0);
    double t0 = time_now();
    for (int g = 0; g < gen; g++) {
        engine_batch b = {S, tok, pos, sl, want};
        if (engine_forward(e, &b, err) < 0) return -1;
        for (int s = 0; s < S; s++) {
            tok[s] = sampler_argmax(e->logits + (size_t)s * e->m->hp.n_vocab, e->m->hp.n_vocab);
            pos[s]++;
        }
    }
    double dt = time_now() - t0;
    e->be->counters(e->be_state, &w1, &k1);
    e->be->profile(e->be_state, p1, BENCH_STAGES);
    row->n_stages = DT_MIN(np, BENCH_STAGES);
    for (int i = 0; i < row->n_stages; i++)
        row->stage[i] = (backend_stage){p1[i].name, (p1[i].seconds - p0[i].seconds) / gen,
                                        (p1[i].weight_bytes - p0[i].weight_bytes) / (uint64_t)gen,
                                        (p1[i].ends - p0[i].ends) / gen};
    for (int s = 0; s < S; s++) kv_slot_release(e->kv, sl[s]);
    row->streams = S;
    row->step_ms = 1e3 * dt / gen;
    row->agg = (double)S * gen / dt;
    row->per_stream = gen / dt;
    row->wbytes = (double)(w1 - w0) / gen;
    row->kvbytes = (double)(k1 - k0) / gen;
    row->gbs = (double)(w1 - w0 + k1 - k0) / dt / 1e9;
    return 0;
}

static double median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n <= 100 */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Paired solo steps: one stream decodes n steps on each engine of eng[0..n_eng) (the solo path,
 * then the unify path where given), each pair after an unmeasured warm-up step of each engine
 * (warm_pair), so 2n steps in all. With two engines each step's pair runs back to back, in
 * alternating order (AB, BA, AB, ...: neither engine always follows the probe's cache sweep),
 * the second once the first one's workers stopped spinning (quiesce), and one pass of the
 * probe's patterns follows the pair: each step's read rate over the best pattern's, so both
 * engines' steps see the same moment of a machine whose bandwidth drifts within seconds.
 * (Before, each step had its own probe pass, ~0.2 s apart: A/A pairs of one engine form against
 * itself read 0.98, 1.01, 0.98 and 1.22 there, and 0.99, 0.99, 0.99 back to back —
 * bench/cpu-speed-log.md, nineteenth session.) Per engine: median and quartiles of the ratios (in %)
 * into q, the median ratio to each pattern alone into by_pattern, the median step's tok/s into
 * tps; *ratio_med = median over the steps of (engine 1's ratio / engine 0's), which with one
 * probe per pair is the ratio of the two steps' read rates. Before that pass, one load-only pass
 * of engine 0's step bytes (bench_probe_stream: the first pattern at a step's length, where each
 * pattern of the pass reads the 1 GiB buffer once) gives ctl (each step's rate over it) and
 * ctl_best (its rate over the best pattern's): how far the best of twelve short windows of a
 * flickering machine lies above what a stream of a step's length reads.
 * Both engines decode the same tokens; *same = whether every step's logits were bitwise equal
 * between them. With trace, each step is also printed as a table row named names[engine]: the
 * probe's best GB/s and the load-only pass's after its pair, its own read rate and ms, and
 * (engines made with profile) each stage's ms in it. */
typedef struct paired_out {
    double q[2][3], by_pattern[2][BENCH_PATTERNS], tps[2], ratio_med;
    double rate_q[3]; /* engine 1's tok/s / engine 0's per step: quartiles and median (rate_q[1]) */
    double split, probe_lo, probe_hi; /* the probes' range and its midpoint, GB/s */
    double phase[2][2];               /* [path][below / at or above split]: median ratio in %, or -1 */
    int phase_n[2][2];                /* steps in each */
    double ctl[2][3];  /* [path]: quartiles and median of the step's read rate over the load-only pass's, in % */
    double ctl_best[3]; /* the load-only pass's rate over the best pattern's: quartiles and median, in % */
    /* by the threads' placement (bench_probe_rtt after each pair: "far" where the round trip is over
     * BENCH_RTT_FAR_NS, i.e. the two threads on two core complexes): [path][near / far] median
     * % of the best pattern and of the load-only pass, or -1; the pairs in each; the round trips' range */
    double place[2][2], place_ctl[2][2], rtt_lo, rtt_hi;
    int place_n[2];
    double rate_place[2]; /* engine 1's tok/s / engine 0's per step, median [near / far], or -1 */
    double waited;        /* seconds spent waiting for the placement asked for (--place) */
    bool same;
} paired_out;

#define BENCH_PLACE_WAIT_S 900.0 /* the most a paired run waits for its placement, in all */

/* Waits until the probe's two threads sit in placement `place` (0: one core complex, a round
 * trip of at most BENCH_RTT_FAR_NS; 1: two) or `budget` seconds pass, checking every 0.2 s;
 * returns the seconds waited. The host moves the VM's vCPUs every few seconds to minutes, so a
 * pair started right after a match most likely runs in that placement (the split after each
 * pair says whether it did). */
static double place_wait(bench_probe *probe, int place, double budget) {
    const double t0 = time_now();
    while ((bench_probe_rtt(probe) > BENCH_RTT_FAR_NS) != place && time_now() - t0 < budget) {
        const struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
    }
    return time_now() - t0;
}

/* After paired_run's trace rows: per path and stage, the median over the steps in each placement
 * (near / far, far[i]) of the stage's ms and, for a stage that reads weights, of its weight rate over
 * the best pattern right after the pair (st_pct; -1 where it read none): which stage loses what. */
static void trace_summary(const char *const *names, int n_eng, int n, int ntps, backend_stage (*stages)[BENCH_STAGES],
                          const int *far, double (*st_ms)[BENCH_STAGES][100], double (*st_pct)[BENCH_STAGES][100]) {
    double any = 0.0; /* engines made without profile time no stage */
    for (int k = 0; k < n_eng; k++)
        for (int s = 0; s < ntps; s++)
            for (int i = 0; i < n; i++) any += st_ms[k][s][i];
    if (any <= 0.0) return;
    printf("\ntrace summary: per stage, the median over the steps in each placement of its ms and, for a stage that reads"
           " weights, of its weight rate as %% of the best pattern right after the pair\n\n"
           "| path | stage | near ms | near %% of the probe | far ms | far %% of the probe |\n|---|---|---:|---:|---:|---:|\n");
    for (int k = 0; k < n_eng; k++)
        for (int s = 0; s < ntps; s++) {
            printf("| %s | %s |", names[k], stages[k][s].name);
            for (int h = 0; h < 2; h++) {
                double v[100], w[100];
                int m = 0, mw = 0;
                for (int i = 0; i < n; i++) {
                    if (far[i] != h) continue;
                    v[m++] = st_ms[k][s][i];
                    if (st_pct[k][s][i] >= 0) w[mw++] = st_pct[k][s][i];
                }
                if (m) printf(" %.3f |", median(v, m));
                else printf(" — |");
                if (mw) printf(" %.1f%% |", median(w, mw));
                else printf(" |");
            }
            printf("\n");
        }
}

/* The warm-up before a measured pair: one unmeasured step of each side, in pair i's order (ABBA),
 * advancing side k's rows (tok[k], pos[k]: the b[k].n rows of batch b[k] on engine eng[k]) as a
 * measured step does. A decode step right after a probe pass reads ~20% slower in every stage than
 * one right after another step (the Zen 5 host, 128-token context: 42-50 ms against 35-40 in most of
 * 30 pairs); a 0.3 s sleep or compute spin in its place did not remove it, nor did pinning the
 * threads; one step did. Without it the pair's first step (each side in turn) carried it, so the
 * per-pair ratios scattered ±15-20% and the medians read ~6 points low against steps back to back
 * (bench/cpu-speed-log.md, fifty-second session). With `first` (V floats), row 0's logits of the
 * two steps are compared into *same. */
static int warm_pair(engine *const eng[2], const engine_batch b[2], int32_t *const tok[2], int32_t *const pos[2],
                     int sides, int i, float *first, bool *same, ditto_err *err) {
    for (int kk = 0; kk < sides; kk++) {
        const int k = sides == 2 && (i & 1) ? 1 - kk : kk;
        engine *e = eng[k];
        if (kk && eng[0] != eng[1]) quiesce(); /* the other engine's workers */
        if (engine_forward(e, &b[k], err) < 0) return -1;
        const int V = e->m->hp.n_vocab;
        if (first && kk) *same = *same && !memcmp(first, e->logits, sizeof(float) * (size_t)V);
        else if (first) memcpy(first, e->logits, sizeof(float) * (size_t)V);
        for (int r = 0; r < b[k].n; r++) tok[k][r] = sampler_argmax(e->logits + (size_t)r * V, V), pos[k][r]++;
    }
    if (sides == 2 && eng[0] != eng[1]) quiesce();
    return 0;
}

static int paired_run(engine *const *eng, const char *const *names, int n_eng, bench_probe *probe, int plen, int n,
                      bool trace, int place, paired_out *po, ditto_err *err) {
    DT_ASSERT(n_eng >= 1 && n_eng <= 2 && n >= 1 && n <= 100);
    int32_t tok[2], pos[2], sl[2];
    int held = 0; /* slots acquired */
    uint8_t want = 1;
    double r[2][100], t[2][100], rp[2][BENCH_PATTERNS][100], x[100], y[100], pv[2][100], ms[2] = {0, 0};
    double cr[2][100], cb[100], step_bytes = 0; /* the steps' and the load-only pass's rates over it / the best pattern's */
    double rt[100]; /* the round trip after each pair, ns */
    int far[100];   /* rt[i] > BENCH_RTT_FAR_NS */
    backend_stage tp0[2][BENCH_STAGES], tp1[2][BENCH_STAGES];
    int ntps = 0;
    /* with trace: each step's ms per stage, and a gemm stage's weight rate over the probe's best after the pair in % (-1: none) */
    double st_ms[2][BENCH_STAGES][100], st_pct[2][BENCH_STAGES][100];
    const int V = eng[0]->m->hp.n_vocab;
    float *warm_logits = xmalloc(sizeof(float) * (size_t)V);
    for (int k = 0; k < n_eng; k++) {
        uint64_t rng = 77;
        sl[k] = kv_slot_acquire(eng[k]->kv);
        held = k + 1;
        pos[k] = plen;
        if (prefill(eng[k], sl[k], plen, &rng, &tok[k], err) < 0) goto fail;
    }
    po->same = true;
    po->waited = 0;
    for (int i = 0; i < n; i++) {
        double gbs[2];
        if (place >= 0) po->waited += place_wait(probe, place, BENCH_PLACE_WAIT_S - po->waited);
        {
            engine *const we[2] = {eng[0], eng[n_eng - 1]};
            const engine_batch wb[2] = {{1, &tok[0], &pos[0], &sl[0], &want}, {1, &tok[1], &pos[1], &sl[1], &want}};
            int32_t *const wt[2] = {&tok[0], &tok[1]}, *const wp[2] = {&pos[0], &pos[1]};
            if (warm_pair(we, wb, wt, wp, n_eng, i, n_eng == 2 ? warm_logits : NULL, &po->same, err) < 0) goto fail;
        }
        for (int kk = 0; kk < n_eng; kk++) {
            const int k = n_eng == 2 && (i & 1) ? 1 - kk : kk; /* ABBA: neither engine always goes first */
            engine *e = eng[k];
            if (kk) quiesce(); /* the other engine's workers */
            uint64_t w0, k0, w1, k1;
            e->be->counters(e->be_state, &w0, &k0);
            engine_batch b = {1, &tok[k], &pos[k], &sl[k], &want};
            if (trace) e->be->profile(e->be_state, tp0[k], BENCH_STAGES);
            double t0 = time_now();
            if (engine_forward(e, &b, err) < 0) goto fail;
            double dt = time_now() - t0;
            e->be->counters(e->be_state, &w1, &k1);
            if (trace) ntps = DT_MAX(0, e->be->profile(e->be_state, tp1[k], BENCH_STAGES));
            tok[k] = sampler_argmax(e->logits, V);
            pos[k]++;
            gbs[k] = (double)(w1 - w0 + k1 - k0) / dt / 1e9;
            if (k == 0) step_bytes = (double)(w1 - w0 + k1 - k0);
            t[k][i] = 1.0 / dt;
            ms[k] = 1e3 * dt;
        }
        if (n_eng == 2) po->same = po->same && !memcmp(eng[0]->logits, eng[1]->logits, sizeof(float) * (size_t)V);
        double pat[BENCH_PATTERNS];
        rt[i] = bench_probe_rtt(probe); /* the threads' placement, right after the pair */
        far[i] = rt[i] > BENCH_RTT_FAR_NS;
        const double ps = bench_probe_stream(probe, step_bytes); /* the first engine's step's bytes, plain loads */
        const double pb = bench_probe_run(probe, 1, pat);
        cb[i] = 100.0 * ps / pb;
        for (int k = 0; k < n_eng; k++) {
            cr[k][i] = 100.0 * gbs[k] / ps;
            pv[k][i] = pb;
            r[k][i] = 100.0 * gbs[k] / pb;
            for (int j = 0; j < BENCH_PATTERNS; j++) rp[k][j][i] = 100.0 * gbs[k] / pat[j];
        }
        if (n_eng == 2) x[i] = r[1][i] / r[0][i], y[i] = t[1][i] / t[0][i];
        for (int k = 0; trace && k < n_eng; k++) { /* one table row per step: the probe after the pair, each stage's ms */
            if (i == 0 && k == 0) {
                printf("\n| trace: path | step | probe GB/s | pass GB/s | rtt ns | step GB/s | step ms |");
                for (int s = 0; s < ntps; s++) printf(" %s |", tp1[k][s].name);
                printf("\n|---|---:|---:|---:|---:|---:|---:|");
                for (int s = 0; s < ntps; s++) printf("---:|");
                printf("\n");
            }
            printf("| %s | %d | %.1f | %.1f | %.0f | %.1f | %.2f |", names[k], i, pb, ps, rt[i], gbs[k], ms[k]);
            for (int s = 0; s < ntps; s++) {
                const double sec = tp1[k][s].seconds - tp0[k][s].seconds;
                const uint64_t wb = tp1[k][s].weight_bytes - tp0[k][s].weight_bytes;
                st_ms[k][s][i] = 1e3 * sec;
                st_pct[k][s][i] = wb && sec > 0 ? 100.0 * (double)wb / sec / 1e9 / pb : -1.0;
                printf(" %.3f |", 1e3 * sec);
            }
            printf("\n");
        }
    }
    if (trace && ntps) trace_summary(names, n_eng, n, ntps, tp1, far, st_ms, st_pct);
    /* by phase: steps whose probe lies below / at or above the midpoint of all the probes' range */
    po->probe_lo = 1e300, po->probe_hi = 0.0;
    for (int k = 0; k < n_eng; k++)
        for (int i = 0; i < n; i++) po->probe_lo = DT_MIN(po->probe_lo, pv[k][i]), po->probe_hi = DT_MAX(po->probe_hi, pv[k][i]);
    po->split = 0.5 * (po->probe_lo + po->probe_hi);
    for (int k = 0; k < n_eng; k++) {
        double ph[2][100];
        int m[2] = {0, 0};
        for (int i = 0; i < n; i++) {
            const int h = pv[k][i] >= po->split;
            ph[h][m[h]++] = r[k][i];
        }
        for (int h = 0; h < 2; h++) po->phase[k][h] = m[h] ? median(ph[h], m[h]) : -1.0, po->phase_n[k][h] = m[h];
    }
    po->rtt_lo = 1e300, po->rtt_hi = 0.0;
    for (int i = 0; i < n; i++) po->rtt_lo = DT_MIN(po->rtt_lo, rt[i]), po->rtt_hi = DT_MAX(po->rtt_hi, rt[i]);
    for (int h = 0; h < 2; h++) {
        double ph[2][100], pc[2][100], yy[100];
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (far[i] != h) continue;
            for (int k = 0; k < n_eng; k++) ph[k][m] = r[k][i], pc[k][m] = cr[k][i];
            if (n_eng == 2) yy[m] = y[i];
            m++;
        }
        po->place_n[h] = m;
        for (int k = 0; k < n_eng; k++) {
            po->place[k][h] = m ? median(ph[k], m) : -1.0;
            po->place_ctl[k][h] = m ? median(pc[k], m) : -1.0;
        }
        po->rate_place[h] = m && n_eng == 2 ? median(yy, m) : -1.0;
    }
    for (int k = 0; k < n_eng; k++) {
        for (int j = 0; j < BENCH_PATTERNS; j++) po->by_pattern[k][j] = median(rp[k][j], n);
        po->q[k][1] = median(r[k], n); /* sorts */
        po->q[k][0] = r[k][n / 4], po->q[k][2] = r[k][(3 * n) / 4];
        po->tps[k] = median(t[k], n);
        po->ctl[k][1] = median(cr[k], n); /* sorts */
        po->ctl[k][0] = cr[k][n / 4], po->ctl[k][2] = cr[k][(3 * n) / 4];
    }
    po->ctl_best[1] = median(cb, n); /* sorts */
    po->ctl_best[0] = cb[n / 4], po->ctl_best[2] = cb[(3 * n) / 4];
    po->ratio_med = n_eng > 1 ? median(x, n) : 0.0;
    po->rate_q[0] = po->rate_q[1] = po->rate_q[2] = 0.0;
    if (n_eng > 1) {
        po->rate_q[1] = median(y, n); /* sorts */
        po->rate_q[0] = y[n / 4], po->rate_q[2] = y[(3 * n) / 4];
    }
    for (int k = 0; k < n_eng; k++) kv_slot_release(eng[k]->kv, sl[k]);
    free(warm_logits);
    return 0;
fail:
    for (int k = 0; k < held; k++) kv_slot_release(eng[k]->kv, sl[k]);
    free(warm_logits);
    return -1;
}

/* Paired batched steps: one stream on the solo path and S streams in one batch decode n steps
 * on engine e, each pair of steps back to back in alternating order after a warm-up step of each
 * (as paired_run's; 2n steps in all) and followed at once by one pass of the probe's patterns.
 * Per step: each path's read rate over the best pattern right after its pair, and the batch's
 * rate in tok/s over the solo step's (x: quartiles and median) — the ratio to solo at equal
 * machine bandwidth, measured ~0.1 s apart; x_all = the batch's aggregate rate over all n steps
 * over the solo stream's (S x the solo steps' summed time / the batch steps'). Row 0 of the batch
 * has the solo stream's prompt (both decode the same tokens), so *same = whether its logits
 * equalled the solo stream's, bitwise, at every step. With an engine made with profile,
 * stage[k][j] = path k's (0: solo, 1: batch) time and weight bytes per step in stage j, means over
 * the n measured steps (n_stages stages). Needs S + 1 free slots. */
typedef struct paired_batch_out {
    double q[2][3], tps[2], x[3], x_all;
    bool same;
    int n_stages;
    backend_stage stage[2][BENCH_STAGES];
} paired_batch_out;

static int paired_batch_run(engine *e, bench_probe *probe, int S, int plen, int n, paired_batch_out *po,
                            ditto_err *err) {
    DT_ASSERT(S >= 2 && S <= 4096 && n >= 1 && n <= 100);
    const int V = e->m->hp.n_vocab, N = S + 1; /* rows 0..S-1: the batch, row S: the solo stream */
    int32_t *tok = xmalloc(sizeof(int32_t) * 3 * (size_t)N), *pos = tok + N, *sl = tok + 2 * N;
    uint8_t *want = xmalloc((size_t)N);
    float *first = xmalloc(sizeof(float) * (size_t)V); /* the logits of the pair's first step */
    double r[2][100], t[2][100], x[100], sum_dt[2] = {0, 0};
    backend_stage p0[BENCH_STAGES], p1[BENCH_STAGES];
    int held = 0, rc = -1;
    po->n_stages = 0;
    memset(po->stage, 0, sizeof po->stage);
    memset(want, 1, (size_t)N);
    /* row 0 and the solo stream (row S): one prompt */
    if (streams_prefill(e, S, plen, 77, tok, pos, sl, &held, err) ||
        streams_prefill(e, 1, plen, 77, tok + S, pos + S, sl + S, &held, err))
        goto out;
    po->same = true;
    for (int i = 0; i < n; i++) {
        double gbs[2];
        {
            engine *const we[2] = {e, e};
            const engine_batch wb[2] = {{1, tok + S, pos + S, sl + S, want + S}, {S, tok, pos, sl, want}};
            int32_t *const wt[2] = {tok + S, tok}, *const wp[2] = {pos + S, pos};
            if (warm_pair(we, wb, wt, wp, 2, i, first, &po->same, err) < 0) goto out;
        }
        for (int kk = 0; kk < 2; kk++) { /* k = 0: the solo stream, 1: the batch; back to back, ABBA */
            const int k = (i & 1) ? 1 - kk : kk, rows = k ? S : 1, at = k ? 0 : S;
            uint64_t w0, k0, w1, k1;
            e->be->counters(e->be_state, &w0, &k0);
            engine_batch b = {rows, tok + at, pos + at, sl + at, want + at};
            const int np = DT_MIN(e->be->profile(e->be_state, p0, BENCH_STAGES), BENCH_STAGES);
            double t0 = time_now();
            if (engine_forward(e, &b, err) < 0) goto out;
            double dt = time_now() - t0;
            e->be->counters(e->be_state, &w1, &k1);
            e->be->profile(e->be_state, p1, BENCH_STAGES);
            po->n_stages = np;
            for (int j = 0; j < np; j++) {
                backend_stage *a = &po->stage[k][j];
                a->name = p1[j].name;
                a->seconds += (p1[j].seconds - p0[j].seconds) / n;
                a->weight_bytes += (p1[j].weight_bytes - p0[j].weight_bytes) / (uint64_t)n;
                a->ends += (p1[j].ends - p0[j].ends) / n;
            }
            sum_dt[k] += dt;
            /* the solo stream's logits against batch row 0's (e->logits holds the last forward's) */
            if (kk) po->same = po->same && !memcmp(first, e->logits, sizeof(float) * (size_t)V);
            else memcpy(first, e->logits, sizeof(float) * (size_t)V);
            for (int s = 0; s < rows; s++) {
                tok[at + s] = sampler_argmax(e->logits + (size_t)s * V, V);
                pos[at + s]++;
            }
            gbs[k] = (double)(w1 - w0 + k1 - k0) / dt / 1e9;
            t[k][i] = rows / dt;
        }
        const double pb = bench_probe_run(probe, 1, NULL);
        for (int k = 0; k < 2; k++) r[k][i] = 100.0 * gbs[k] / pb;
        x[i] = t[1][i] / t[0][i];
    }
    for (int k = 0; k < 2; k++) {
        po->tps[k] = median(t[k], n);
        po->q[k][1] = median(r[k], n); /* sorts */
        po->q[k][0] = r[k][n / 4], po->q[k][2] = r[k][(3 * n) / 4];
    }
    po->x[1] = median(x, n); /* sorts */
    po->x[0] = x[n / 4], po->x[2] = x[(3 * n) / 4];
    po->x_all = S * sum_dt[0] / sum_dt[1];
    rc = 0;
out:
    streams_release(e, sl, held);
    free(tok);
    free(want);
    free(first);
    return rc;
}

/* Medians over the repeats; the ratio to solo pairs each repeat's row with that repeat's
 * solo row (measured a minute apart, not an afternoon). The last column divides each
 * row's rate by the probe run beside it first: the ratio at equal machine bandwidth,
 * which a neighbour's burst during one row distorts less. */
static void summary(const int *streams, int n_streams, int rows, int repeat, bool unify, double agg[17][100],
                    double adj[17][100], double probe[17][100]) {
    printf("\n| streams | path | median tok/s | min | max | median %% of adj. | median x solo | median x solo, per probe GB/s |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|\n");
    int solo = !unify && streams[0] == 1 ? 0 : -1;
    for (int i = 0; i < rows; i++) {
        bool u = i == n_streams;
        if (!u && unify && streams[i] == 1) continue;
        double a[100], p[100], x[100], xn[100];
        for (int r = 0; r < repeat; r++) {
            a[r] = agg[i][r];
            p[r] = adj[i][r];
            x[r] = solo >= 0 ? agg[i][r] / agg[solo][r] : 0.0;
            xn[r] = solo >= 0 ? (agg[i][r] / probe[i][r]) / (agg[solo][r] / probe[solo][r]) : 0.0;
        }
        double mn = a[0], mx = a[0];
        for (int r = 1; r < repeat; r++) mn = DT_MIN(mn, a[r]), mx = DT_MAX(mx, a[r]);
        printf("| %d | %s | %.2f | %.2f | %.2f | %.0f%% | %.2f | %.2f |\n", u ? 1 : streams[i],
               u ? "unify (batched)" : (streams[i] == 1 ? "solo" : "batched"), median(a, repeat), mn, mx,
               median(p, repeat), median(x, repeat), median(xn, repeat));
    }
}

/* The gemm kernel calls made between two snapshots of the calls profile (backend_ops.calls), by kind:
 * how fast each kind read its weights, per thread. */
#define BENCH_CALL_KINDS 8
static void print_calls(const backend_calls *c0, const backend_calls *c1, int n, const char *what) {
    printf("\ngemm kernel calls %s, by tokens per call (thread time inside the calls, summed over threads)\n\n"
           "| calls | count | weight MiB | KiB a call | thread ms | GB/s a thread |\n|---|---:|---:|---:|---:|---:|\n",
           what);
    for (int k = 0; k < n; k++) {
        const double cnt = (double)(c1[k].calls - c0[k].calls), b = (double)(c1[k].weight_bytes - c0[k].weight_bytes);
        const double ts = c1[k].thread_seconds - c0[k].thread_seconds;
        if (cnt <= 0) continue;
        printf("| %s | %.0f | %.1f | %.1f | %.1f | %.1f |\n", c1[k].name, cnt, b / 1048576.0, b / cnt / 1024.0, ts * 1e3,
               ts > 0 ? b / ts / 1e9 : 0.0);
    }
}

/* Per-stage table of the first repeat's rows: ms per step, and GB/s where a stage reads weights. */
static void print_profile(const bench_row *rows, int n) {
    if (n < 1 || rows[0].n_stages < 1) return;
    printf("\nper-stage time per decode step (first repeat): ms, and for gemm stages weight GB/s and the ms from the first"
           " thread done with the stage's gemm work to the last (summed over the step's calls); for other stages"
           " that end at a barrier (the one-job solo step), the ms from the first thread there to the last\n\n| stage |");
    for (int i = 0; i < n; i++) printf(" %d %s |", rows[i].streams, rows[i].label);
    printf("\n|---|");
    for (int i = 0; i < n; i++) printf("---:|");
    printf("\n");
    for (int s = 0; s < rows[0].n_stages; s++) {
        printf("| %s |", rows[0].stage[s].name);
        for (int i = 0; i < n; i++) {
            const backend_stage *b = &rows[i].stage[s];
            if (b->weight_bytes && b->seconds > 0)
                printf(" %.2f (%.0f GB/s; ends %.2f) |", 1e3 * b->seconds, (double)b->weight_bytes / b->seconds / 1e9,
                       1e3 * b->ends);
            else if (b->ends > 0) /* a barrier's spread: the stage before it ended unevenly */
                printf(" %.2f (ends %.2f) |", 1e3 * b->seconds, 1e3 * b->ends);
            else
                printf(" %.2f |", 1e3 * b->seconds);
        }
        printf("\n");
    }
    printf("| sum of stages |");
    for (int i = 0; i < n; i++) {
        double t = 0;
        for (int s = 0; s < rows[i].n_stages; s++) t += rows[i].stage[s].seconds;
        printf(" %.2f of %.2f |", 1e3 * t, rows[i].step_ms);
    }
    printf("\n");
}

/* Per-stage table of the timed prefill (engine made with profile): each stage's ms over the whole
 * prompt, its share of the prefill's time, and weight GB/s where it reads weights. p0 / p1: the
 * backend's counters before and after. */
static void print_prefill_profile(const backend_stage *p0, const backend_stage *p1, int n, double seconds) {
    if (n < 1) return;
    printf("per-stage time of the prefill: ms, share, and for gemm stages weight GB/s and the ms from the first thread"
           " done with the stage's gemm work to the last\n\n| stage | ms | share | GB/s | ends ms |\n|---|---:|---:|---:|---:|\n");
    double sum = 0;
    for (int s = 0; s < n; s++) {
        const double t = p1[s].seconds - p0[s].seconds;
        const uint64_t wb = p1[s].weight_bytes - p0[s].weight_bytes;
        sum += t;
        printf("| %s | %.1f | %.1f%% |", p1[s].name, 1e3 * t, 100.0 * t / seconds);
        if (wb && t > 0)
            printf(" %.1f | %.1f |\n", (double)wb / t / 1e9, 1e3 * (p1[s].ends - p0[s].ends));
        else
            printf(" | |\n");
    }
    printf("| sum of stages | %.1f of %.1f | | | |\n\n", 1e3 * sum, 1e3 * seconds);
}

/* Per-stage table of the paired batches (engine made with profile): each stage's ms per step on
 * the solo path and in each batch, their ratio, and weight GB/s where the stage reads weights —
 * where a batch's time goes, measured step beside step with the solo stream's. */
static void print_paired_profile(const paired_batch_out *pb, const int *streams, int n, int steps) {
    if (n < 1 || pb[0].n_stages < 1) return;
    printf("\npaired batches per stage (means over the %d steps of each path): ms per step, weight GB/s of gemm stages,"
           " and the batch's ms over the solo stream's\n\n| stage | solo |", steps);
    for (int i = 0; i < n; i++) printf(" %d streams | x |", streams[i]);
    printf("\n|---|---:|");
    for (int i = 0; i < n; i++) printf("---:|---:|");
    printf("\n");
    double tot[17][2] = {{0}};
    for (int s = 0; s < pb[0].n_stages; s++) {
        printf("| %s |", pb[0].stage[0][s].name);
        for (int i = -1; i < n; i++) {
            const backend_stage *b = &pb[i < 0 ? 0 : i].stage[i < 0 ? 0 : 1][s];
            if (b->weight_bytes && b->seconds > 0)
                printf(" %.2f (%.0f GB/s) |", 1e3 * b->seconds, (double)b->weight_bytes / b->seconds / 1e9);
            else
                printf(" %.2f |", 1e3 * b->seconds);
            if (i >= 0) {
                const double so = pb[i].stage[0][s].seconds;
                printf(so > 0 ? " %.2f |" : " – |", b->seconds / so);
                tot[i][0] += so, tot[i][1] += b->seconds;
            }
        }
        printf("\n");
    }
    printf("| sum of stages | %.2f |", 1e3 * tot[0][0]);
    for (int i = 0; i < n; i++) printf(" %.2f | %.2f |", 1e3 * tot[i][1], tot[i][1] / tot[i][0]);
    printf("\n");
}

/* "MODEL NAME (VENDOR family F model M), N CPUs online" from /proc/cpuinfo's first processor:
 * the VM's host changes between runs, and figures compare only on one. "unknown" parts where
 * the file or a field is missing. */
static void cpu_describe(char *buf, size_t cap) {
    char name[128] = "unknown", vendor[32] = "unknown", fam[16] = "?", mod[16] = "?", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    bool at_start = true; /* line holds the start of a line, not the rest of a long one (flags) */
    while (f && fgets(line, sizeof line, f)) {
        const bool start = at_start;
        at_start = strchr(line, '\n') != NULL;
        if (!start) continue;
        if (line[0] == '\n') break; /* the end of the first processor's block */
        char *colon = strchr(line, ':');
        if (!colon) continue;
        char *v = colon + 1 + strspn(colon + 1, " \t");
        v[strcspn(v, "\n")] = 0;
        size_t kl = (size_t)(colon - line); /* the key, trailing blanks cut */
        while (kl && (line[kl - 1] == ' ' || line[kl - 1] == '\t')) kl--;
        line[kl] = 0;
        if (!strcmp(line, "vendor_id")) snprintf(vendor, sizeof vendor, "%s", v);
        else if (!strcmp(line, "cpu family")) snprintf(fam, sizeof fam, "%s", v);
        else if (!strcmp(line, "model")) snprintf(mod, sizeof mod, "%s", v);
        else if (!strcmp(line, "model name")) snprintf(name, sizeof name, "%s", v);
    }
    if (f) fclose(f);
    snprintf(buf, cap, "%s (%s family %s model %s), %d CPUs online", name, vendor, fam, mod, cli_default_threads(1 << 20));
}

/* The per-step tok/s ratio of a paired run's two engines by the threads' placement (paired_out). */
static void print_placement_ratio(const paired_out *po) {
    if (po->waited > 0) printf("(%.0f s waited for the placement asked for) ", po->waited);
    printf("by the threads' placement (round trip %.0f–%.0f ns; far: over %d): ", po->rtt_lo, po->rtt_hi, BENCH_RTT_FAR_NS);
    for (int h = 0; h < 2; h++) {
        printf("%s%s: ", h ? "; " : "", h ? "far" : "near");
        if (po->rate_place[h] >= 0) printf("ratio %.3f (%d steps)", po->rate_place[h], po->place_n[h]);
        else printf("no steps");
    }
    printf("\n");
}

/* --forms: n solo steps of one stream in near-far and in each other one-token stream form
 * (cpu/prefetch.h), in one process, each pair back to back in alternating order (paired_run);
 * prints each form's per-step tok/s ratio to near-far (the fairest A/B this VM allows: the phases
 * hit both alike) and whether the forms' logits were bitwise equal at every step. */
static int forms_run(model *m, const engine_opts *base, bench_probe *probe, int plen, int n, bool trace, int place,
                     ditto_err *err) {
    engine *ef[CPU_STREAM_COUNT] = {NULL};
    paired_out po[CPU_STREAM_COUNT];
    int rc = -1;
    for (int f = 0; f < CPU_STREAM_COUNT; f++) {
        engine_opts o = *base;
        o.max_streams = 1, o.unify = false, o.profile = false, o.cpu_stream = f;
        if (o.cpu_one_job < 0) o.cpu_one_job = 0; /* one step form for every stream form (its default follows the form) */
        if (engine_create(&ef[f], m, &o, err)) goto done;
    }
    for (int f = 1; f < CPU_STREAM_COUNT; f++) {
        engine *const pair[2] = {ef[CPU_STREAM_NEAR_FAR], ef[f]};
        const char *const names[2] = {cpu_stream_name(CPU_STREAM_NEAR_FAR), cpu_stream_name(f)};
        if (paired_run(pair, names, 2, probe, plen, n, trace, place, &po[f], err) < 0) goto done;
    }
    printf("\nstream forms (%d solo steps in %s and in each other form, each pair back to back in alternating order,"
           " after a warm-up step of each, and followed by one probe pass):\n\n"
           "| form | backend | median tok/s | %% of the best pattern (quartiles) | its near-far steps: tok/s, %% |"
           " / near-far, median of the per-step tok/s ratios (quartiles) | logits bitwise equal |\n"
           "|---|---|---:|---|---|---|---|\n",
           n, cpu_stream_name(CPU_STREAM_NEAR_FAR));
    for (int f = 1; f < CPU_STREAM_COUNT; f++)
        printf("| %s | %s | %.2f | %.0f%% (%.0f–%.0f%%) | %.2f, %.0f%% | %.3f (%.3f–%.3f) | %s |\n", cpu_stream_name(f),
               ef[f]->be->describe(ef[f]->be_state), po[f].tps[1], po[f].q[1][1], po[f].q[1][0], po[f].q[1][2],
               po[f].tps[0], po[f].q[0][1], po[f].rate_q[1], po[f].rate_q[0], po[f].rate_q[2], po[f].same ? "yes" : "NO");
    for (int f = 1; f < CPU_STREAM_COUNT; f++) {
        printf("%s / %s ", cpu_stream_name(f), cpu_stream_name(CPU_STREAM_NEAR_FAR));
        print_placement_ratio(&po[f]);
    }
    rc = 0;
done:
    for (int f = 0; f < CPU_STREAM_COUNT; f++) engine_free(ef[f]);
    return rc;
}

/* n decode steps of a batch of S streams (S prompts of plen tokens, the same in both) with options
 * va (A) and vb (B), one engine each, the two steps of a pair back to back in alternating order;
 * prints B against A per pair and over all steps, and whether the logits were bitwise equal at
 * every step where B runs the model (b_model). */
static int batch_ab_run(model *m, const engine_opts *va, const engine_opts *vb, int S, const char *what, const char *a,
                        const char *b, bool b_model, int plen, int n, ditto_err *err) {
    DT_ASSERT(S >= 2 && S <= 4096 && n >= 1 && n <= 100);
    engine *ea[2] = {NULL, NULL};
    const int V = m->hp.n_vocab;
    int32_t *tok = xmalloc(sizeof(int32_t) * 6 * (size_t)S), *pos = tok + 2 * S, *sl = tok + 4 * S; /* [engine][S] */
    uint8_t *want = xmalloc((size_t)S);
    float *lg = xmalloc(sizeof(float) * (size_t)S * (size_t)V);
    double x[100], sum_dt[2] = {0, 0};
    bool same = true;
    int held[2] = {0, 0}, rc = -1;
    memset(want, 1, (size_t)S);
    for (int k = 0; k < 2; k++) {
        engine_opts o = k ? *vb : *va;
        o.max_streams = S, o.unify = false, o.profile = false;
        o.max_rows = DT_MAX(o.max_rows, S); /* a step of S rows */
        if (engine_create(&ea[k], m, &o, err) ||
            streams_prefill(ea[k], S, plen, 77, tok + k * S, pos + k * S, sl + k * S, &held[k], err))
            goto done;
    }
    for (int i = 0; i < n; i++) {
        double dt[2];
        for (int kk = 0; kk < 2; kk++) {
            const int k = (i & 1) ? 1 - kk : kk;
            quiesce(); /* the workers of the engine that ran last */
            engine_batch bt = {S, tok + k * S, pos + k * S, sl + k * S, want};
            const double t0 = time_now();
            if (engine_forward(ea[k], &bt, err) < 0) goto done;
            dt[k] = time_now() - t0;
            sum_dt[k] += dt[k];
            if (kk) same = same && !memcmp(lg, ea[k]->logits, sizeof(float) * (size_t)S * (size_t)V);
            else memcpy(lg, ea[k]->logits, sizeof(float) * (size_t)S * (size_t)V);
            for (int s = 0; s < S; s++) tok[k * S + s] = sampler_argmax(ea[k]->logits + (size_t)s * V, V), pos[k * S + s]++;
        }
        x[i] = dt[0] / dt[1];
    }
    const double med = median(x, n); /* sorts */
    printf("\n%s (%d decode steps of a batch of %d streams, A %s and B %s, each pair back to back in alternating order):"
           " B against A: per-step rate ratio B / A, median %.3f (quartiles %.3f–%.3f), over all steps %.3f; aggregate"
           " tok/s %.2f against %.2f; %s\n",
           what, n, S, a, b, med, x[n / 4], x[(3 * n) / 4], sum_dt[0] / sum_dt[1], S * n / sum_dt[1], S * n / sum_dt[0],
           !b_model ? "logits not compared (B's are not the model's)"
           : same ? "logits bitwise equal at every step: yes" : "logits bitwise equal at every step: NO");
    printf("A: %s; B: %s; forward calls by path (prefill chunks included): A %llu on the solo path, %llu on the batched"
           " path; B %llu on the solo path, %llu on the batched path\n",
           ea[0]->be->describe(ea[0]->be_state), ea[1]->be->describe(ea[1]->be_state), (unsigned long long)ea[0]->n_solo,
           (unsigned long long)ea[0]->n_batched, (unsigned long long)ea[1]->n_solo, (unsigned long long)ea[1]->n_batched);
    rc = 0;
done:
    for (int k = 0; k < 2; k++) {
        streams_release(ea[k], sl + k * S, held[k]); /* held[k] = 0 where ea[k] was not made */
        engine_free(ea[k]);
    }
    free(tok);
    free(want);
    free(lg);
    return rc;
}

/* The pairing of two engines' options (--*-ab): the probe, the prompt length, the pairs, the
 * threads' placement asked for, and the streams a step (1: solo steps, paired_run; more: batches,
 * batch_ab_run, which waits for no placement and runs no probe: bench_cmd refuses --place with it). */
typedef struct ab_args {
    bench_probe *probe;
    int plen, n, place, streams;
    bool trace; /* solo steps: both engines profiled, each step's stages printed and summed up per engine */
    int switched; /* > 0: that many pairs on one engine, the options switched between its steps (switch_ab_run) */
} ab_args;

#define BENCH_SWITCH_MAX 2000 /* the most pairs of a switched A/B */

/* n pairs of decode steps on ONE engine whose run-time options (engine_retune) are switched between
 * consecutive steps: A then B, B then A, ... with no probe pass, sleep or other engine between them,
 * so both sides of a pair see the same moment of the machine and the same warm pool (opts_ab_run's
 * solo pairs, with a probe pass after every pair, scattered ±20% per pair on the Zen 5 host before
 * their warm-up step (warm_pair), ±2.5% since; back-to-back steps of one engine ±2–3%). Side k steps
 * a batch of sk[k] streams (1: solo steps): with equal sizes both sides step the same streams, in
 * turn; with different ones (--batch-ab) each side its own. Prints B against A: the per-pair ratio
 * of the aggregate rates (tokens a second over the batch's streams), its median and quartiles, and
 * the ratio over all steps. A stream's tokens come from both sides in turn, so A's and B's logits
 * are not compared here (the two-engine A/B and the tests do that); b_model: whether B runs the
 * model at all. */
static int switch_ab_run(model *m, const engine_opts *va, const engine_opts *vb, const char *what, const char *a,
                         const char *b, bool b_model, int plen, const int sk[2], int n, ditto_err *err) {
    const bool shared = sk[0] == sk[1];
    const int total = shared ? sk[0] : sk[0] + sk[1], off[2] = {0, shared ? 0 : sk[0]};
    DT_ASSERT(n >= 1 && n <= BENCH_SWITCH_MAX && sk[0] >= 1 && sk[1] >= 1 && total <= 4096);
    engine_opts o[2] = {*va, *vb};
    for (int k = 0; k < 2; k++) {
        o[k].max_streams = total, o[k].profile = false; /* unify as given: --unify-ab switches it */
        o[k].max_rows = DT_MAX(o[k].max_rows, DT_MAX(sk[0], sk[1])); /* a step of the larger batch */
    }
    engine *e = NULL;
    double *x = xmalloc(sizeof(double) * (size_t)n), sum[2] = {0, 0};
    int32_t *tok = xmalloc(sizeof(int32_t) * 3 * (size_t)total), *pos = tok + total, *sl = tok + 2 * total;
    uint8_t *want = xmalloc((size_t)total);
    int rc = -1, held = 0;
    memset(want, 1, (size_t)total);
    if (engine_create(&e, m, &o[0], err) || streams_prefill(e, total, plen, 77, tok, pos, sl, &held, err)) goto done;
    const uint64_t solo0 = e->n_solo, batched0 = e->n_batched; /* the prefill's calls aside */
    const int warm = 4; /* unmeasured steps first: the pool's threads and the weights' first touches */
    for (int i = -warm; i < n; i++) {
        double dt[2];
        for (int kk = 0; kk < 2; kk++) {
            const int k = (i & 1) ? 1 - kk : kk; /* ABBA: neither side always follows the other */
            if (engine_retune(e, &o[k], err)) goto done;
            const int f = off[k];
            engine_batch bt = {sk[k], tok + f, pos + f, sl + f, want};
            const double t0 = time_now();
            if (engine_forward(e, &bt, err) < 0) goto done;
            dt[k] = time_now() - t0;
            for (int s = f; s < f + sk[k]; s++)
                tok[s] = sampler_argmax(e->logits + (size_t)(s - f) * m->hp.n_vocab, m->hp.n_vocab), pos[s]++;
        }
        if (i < 0) continue;
        sum[0] += dt[0] / sk[0], sum[1] += dt[1] / sk[1]; /* seconds a token */
        x[i] = (dt[0] / sk[0]) / (dt[1] / sk[1]);
    }
    const double med = median(x, n); /* sorts */
    char steps[96];
    if (!shared) snprintf(steps, sizeof steps, "decode steps"); /* a and b name the sides' batches */
    else if (sk[0] > 1) snprintf(steps, sizeof steps, "decode steps of a batch of %d streams", sk[0]);
    else snprintf(steps, sizeof steps, "solo steps");
    printf("\n%s, switched (%d pairs of %s on one engine, A %s and B %s, %s in alternating order, no probe between):"
           " per-pair rate ratio B / A, median %.3f (quartiles %.3f–%.3f), over all steps %.3f; tok/s %.2f against %.2f;"
           " %s\n",
           what, n, steps, a, b, shared ? "the options switched between consecutive steps" : "the sides' steps back to back",
           med, x[n / 4], x[(3 * n) / 4], sum[0] / sum[1], n / sum[1], n / sum[0],
           !b_model ? "B's results are not the model's"
           : shared ? "logits not compared here (the two-engine A/B compares them)"
                    : "logits not compared here (the paired batches compare a batch's row 0 with a solo stream)");
    char dA[256];
    if (engine_retune(e, &o[0], err)) goto done;
    snprintf(dA, sizeof dA, "%s", e->be->describe(e->be_state));
    if (engine_retune(e, &o[1], err)) goto done;
    printf("A: %s; B: %s; decode steps by path: %llu on the solo path, %llu on the batched path\n", dA,
           e->be->describe(e->be_state), (unsigned long long)(e->n_solo - solo0),
           (unsigned long long)(e->n_batched - batched0));
    rc = 0;
done:
    streams_release(e, sl, held);
    engine_free(e);
    free(x);
    free(tok);
    free(want);
    return rc;
}

/* ab->n solo steps of one stream with options va (A) and vb (B), paired as --forms pairs the
 * stream forms (with ab->streams > 1, batches of that many streams: batch_ab_run); what: the
 * question, a / b: A's and B's setting. Prints B against A, and whether their logits were bitwise
 * equal at every step where B runs the model (b_model). */
static int opts_ab_run(model *m, const engine_opts *va, const engine_opts *vb, const char *what, const char *a,
                       const char *b, bool b_model, const ab_args *ab, ditto_err *err) {
    if (ab->switched)
        return switch_ab_run(m, va, vb, what, a, b, b_model, ab->plen, (const int[2]){ab->streams, ab->streams},
                             ab->switched, err);
    if (ab->streams > 1) return batch_ab_run(m, va, vb, ab->streams, what, a, b, b_model, ab->plen, ab->n, err);
    bench_probe *probe = ab->probe;
    const int plen = ab->plen, n = ab->n, place = ab->place;
    engine *ea[2] = {NULL, NULL};
    int rc = -1;
    for (int k = 0; k < 2; k++) {
        engine_opts o = k ? *vb : *va;
        o.max_streams = 1, o.profile = ab->trace; /* unify as given: --unify-ab pairs the paths */
        if (engine_create(&ea[k], m, &o, err)) goto done;
    }
    paired_out po;
    const char *const names[2] = {"A", "B"};
    if (paired_run(ea, names, 2, probe, plen, n, ab->trace, place, &po, err) < 0) goto done;
    printf("\n%s (%d solo steps, A %s and B %s, each pair back to back in alternating order, after a warm-up step of"
           " each, and followed by one probe pass): B against A: %% of the best pattern %.0f%% (%.0f–%.0f%%) against"
           " %.0f%% (%.0f–%.0f%%); tok/s %.2f against %.2f; per-step tok/s ratio B / A, median %.3f (quartiles"
           " %.3f–%.3f); %s\n",
           what, n, a, b, po.q[1][1], po.q[1][0], po.q[1][2], po.q[0][1], po.q[0][0], po.q[0][2], po.tps[1], po.tps[0],
           po.rate_q[1], po.rate_q[0], po.rate_q[2],
           !b_model ? "logits not compared (B's are not the model's)"
           : po.same ? "logits bitwise equal at every step: yes" : "logits bitwise equal at every step: NO");
    print_placement_ratio(&po);
    printf("A: %s; B: %s; forward calls by path (prefill chunks included): A %llu on the solo path, %llu on the batched"
           " path; B %llu on the solo path, %llu on the batched path\n",
           ea[0]->be->describe(ea[0]->be_state), ea[1]->be->describe(ea[1]->be_state), (unsigned long long)ea[0]->n_solo,
           (unsigned long long)ea[0]->n_batched, (unsigned long long)ea[1]->n_solo, (unsigned long long)ea[1]->n_batched);
    rc = 0;
done:
    for (int k = 0; k < 2; k++) engine_free(ea[k]);
    return rc;
}

/* --ahead-ab B: the run's requests ahead (--ahead, or the default) against B bytes. */
static int ahead_run(model *m, const engine_opts *base, long bytes, const ab_args *ab, ditto_err *err) {
    engine_opts vb = *base;
    vb.cpu_ahead = bytes;
    char a[48], b[32];
    if (base->cpu_ahead < 0) snprintf(a, sizeof a, "with the default %d bytes", CPU_AHEAD_BYTES);
    else snprintf(a, sizeof a, "with %ld bytes", base->cpu_ahead);
    snprintf(b, sizeof b, "with %ld", bytes);
    return opts_ab_run(m, base, &vb, "requests ahead", a, b, true, ab, err);
}

/* --form-ab F: the run's one-token stream form (this host's) against form F (enum cpu_stream). The
 * solo step's form (--one-job) follows each stream form's default unless given; the line after
 * the A/B names both engines. With fl (--float-form-ab F), the float kernels' form alone (how the
 * f32 router's rows are streamed), the rest of the step alike. */
static int form_run(model *m, const engine_opts *base, int f, bool fl, const ab_args *ab, ditto_err *err) {
    engine_opts vb = *base;
    if (fl) vb.cpu_float_form = f;
    else vb.cpu_stream = f;
    char b[32];
    snprintf(b, sizeof b, "in %s", cpu_stream_name((enum cpu_stream)f));
    return opts_ab_run(m, base, &vb, fl ? "float kernels' form" : "stream form", "in this host's form", b, true, ab, err);
}

/* --one-job-ab B: the run's solo step form (--one-job, or the default) against B (0: a pool job
 * per stage, 1: the step as one pool job with barriers). */
static int one_job_run(model *m, const engine_opts *base, int b_on, const ab_args *ab, ditto_err *err) {
    engine_opts vb = *base;
    vb.cpu_one_job = b_on;
    static const char *const form[2] = {"a pool job per stage", "one pool job a step"};
    const char *a = base->cpu_one_job < 0 ? "the default" : form[base->cpu_one_job];
    return opts_ab_run(m, base, &vb, "solo step form", a, form[b_on], true, ab, err);
}

/* --claim-runs-ab R: the run's claimed-run cap (CLAIM_RUNS, cpu/claim.h) against runs of at most
 * 1 / R of a thread's segment: the trade between longer kernel calls (fewer stream starts) and
 * finer stealing at a stage's end, either way. */
static int claim_runs_run(model *m, const engine_opts *base, int runs, const ab_args *ab, ditto_err *err) {
    engine_opts vb = *base;
    vb.cpu_claim_runs = runs;
    char a[96], b[48];
    const int solo_runs = cpu_stream_select(cpu_level_detect(), base->cpu_stream) == CPU_STREAM_TWO_L1 ? CLAIM_RUNS_TWO_L1_SOLO
                                                                                                     : CLAIM_RUNS;
    if (base->cpu_claim_runs > 0) snprintf(a, sizeof a, "runs of 1/%d of a segment", base->cpu_claim_runs);
    else snprintf(a, sizeof a, "the default runs (1/%d of a segment in a solo step, 1/%d in a batch)", solo_runs, CLAIM_RUNS);
    snprintf(b, sizeof b, "runs of 1/%d", runs);
    return opts_ab_run(m, base, &vb, "claimed runs", a, b, true, ab, err);
}

/* --loads-only-ab: the run's solo steps against the same steps whose gemm calls only load their
 * weight bytes (backend_opts.cpu_loads_only): B's share of the best pattern is what the step's
 * structure alone allows (its stages, barriers, small stages and jumps between matrices), and
 * B / A how much the kernels' compute costs on top of it. */
static int loads_only_run(model *m, const engine_opts *base, const ab_args *ab, ditto_err *err) {
    engine_opts vb = *base;
    vb.cpu_loads_only = true;
    return opts_ab_run(m, base, &vb, "the step's structure", "as it runs", "with its gemm calls loading only", false,
                       ab, err);
}

/* --unify-ab: the solo path (matrix-vector, the one-job step where that is the host's form) against
 * the batched path at one row (engine_opts.unify), the "unify within 5%" goal. Paired on two
 * engines it compares their logits step by step; switched (--switch N) on one engine it resolves
 * ~0.5% (the two-engine pairing read ±5-15% a run before its warm-up step, ±2.5% a pair since). */
static int unify_run(model *m, const engine_opts *base, const ab_args *ab, ditto_err *err) {
    engine_opts va = *base, vb = *base;
    va.unify = false;
    vb.unify = true;
    return opts_ab_run(m, &va, &vb, "unify", "on the solo path", "on the batched path (--unify)", true, ab, err);
}

/* --batch-ab S (with --switch N only): solo steps of one stream (A) against decode steps of a batch of
 * S other streams (B) on one engine, back to back: the "aggregate decode at 6 streams ≥ 1.6x
 * the single-stream rate" as the ratio of the two aggregate rates, step pair by step pair. (The
 * paired batches of --streams 1,S --paired N put a probe pass after every pair: ±15% a pair before their
 * warm-up step, ±5-8% since.) */
static int batch_switch_run(model *m, const engine_opts *base, int S, const ab_args *ab, ditto_err *err) {
    char b[48];
    snprintf(b, sizeof b, "a batch of %d streams", S);
    return switch_ab_run(m, base, base, "aggregate decode rate", "one stream", b, true, ab->plen, (const int[2]){1, S},
                         ab->switched, err);
}

int bench_cmd(int argc, char **argv) {
    const char *path = "models/tiny-qwen3moe-q4_k_m.gguf";
    int streams[16] = {1, 6, 16}, n_streams = 3, plen = 128, gen = 32, threads = cli_default_threads(256), repeat = 1, paired = 0;
    bool unify = false, profile = false, trace = false, forms = false;
    bool loads_only_ab = false, loads_only = false, unify_ab = false;
    int ahead = -1, ahead_ab = -1, form_ab = -1, chunk = 512, place = -1, one_job = -1, one_job_ab = -1, claim_runs_ab = -1,
        float_form_ab = -1, ab_streams = 1, sw = 0, batch_ab = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-m") && has) path = argv[++i];
        else if (!strcmp(a, "--streams") && has) {
            if ((n_streams = parse_list(argv[++i], streams, 16)) < 1) {
                fprintf(stderr, "ditto bench: --streams expects a list like 1,6,16\n");
                return 2;
            }
        } else if (!strcmp(a, "--prompt-len") && has) {
            if (cli_int("bench", a, argv[++i], 1, 1 << 20, &plen)) return 2;
        } else if (!strcmp(a, "--gen-len") && has) {
            if (cli_int("bench", a, argv[++i], 1, 1 << 20, &gen)) return 2;
        } else if (!strcmp(a, "--threads") && has) {
            if (cli_int("bench", a, argv[++i], 1, 256, &threads)) return 2;
        } else if (!strcmp(a, "--repeat") && has) {
            if (cli_int("bench", a, argv[++i], 1, 100, &repeat)) return 2;
        } else if (!strcmp(a, "--paired") && has) {
            if (cli_int("bench", a, argv[++i], 0, 100, &paired)) return 2;
        } else if (!strcmp(a, "--prefill-chunk") && has) {
            if (cli_int("bench", a, argv[++i], 1, 1 << 16, &chunk)) return 2;
        } else if (!strcmp(a, "--ahead") && has) {
            if (cli_int("bench", a, argv[++i], 0, 1 << 30, &ahead)) return 2;
        } else if (!strcmp(a, "--ahead-ab") && has) {
            if (cli_int("bench", a, argv[++i], 0, 1 << 30, &ahead_ab)) return 2;
        } else if (!strcmp(a, "--one-job") && has) {
            if (cli_int("bench", a, argv[++i], 0, 1, &one_job)) return 2;
        } else if (!strcmp(a, "--one-job-ab") && has) {
            if (cli_int("bench", a, argv[++i], 0, 1, &one_job_ab)) return 2;
        } else if (!strcmp(a, "--switch") && has) {
            if (cli_int("bench", a, argv[++i], 1, BENCH_SWITCH_MAX, &sw)) return 2;
        } else if (!strcmp(a, "--batch-ab") && has) {
            if (cli_int("bench", a, argv[++i], 2, 4095, &batch_ab)) return 2;
        } else if (!strcmp(a, "--ab-streams") && has) {
            if (cli_int("bench", a, argv[++i], 1, 64, &ab_streams)) return 2;
        } else if (!strcmp(a, "--claim-runs-ab") && has) {
            if (cli_int("bench", a, argv[++i], 1, CLAIM_RUNS_MAX, &claim_runs_ab)) return 2;
        } else if ((!strcmp(a, "--form-ab") || !strcmp(a, "--float-form-ab")) && has) {
            int *dst = !strcmp(a, "--float-form-ab") ? &float_form_ab : &form_ab;
            if ((*dst = cpu_stream_parse(argv[++i])) < 0) {
                fprintf(stderr, "ditto bench: %s expects one of", a);
                for (int f = 0; f < CPU_STREAM_COUNT; f++) fprintf(stderr, " %s", cpu_stream_name((enum cpu_stream)f));
                fprintf(stderr, "\n");
                return 2;
            }
        } else if (!strcmp(a, "--loads-only-ab")) loads_only_ab = true;
        else if (!strcmp(a, "--unify-ab")) unify_ab = true;
        else if (!strcmp(a, "--loads-only")) loads_only = true;
        else if (!strcmp(a, "--unify")) unify = true;
        else if (!strcmp(a, "--profile")) profile = true;
        else if (!strcmp(a, "--trace")) trace = true;
        else if (!strcmp(a, "--forms")) forms = true;
        else if (!strcmp(a, "--place") && has && (!strcmp(argv[i + 1], "near") || !strcmp(argv[i + 1], "far")))
            place = !strcmp(argv[++i], "far");
        else {
            fprintf(stderr, "usage: ditto bench -m FILE [--streams 1,6,16] [--prompt-len P] [--gen-len G] [--threads T=NCPU] [--unify] [--repeat R] [--prefill-chunk C=512] [--paired N [--trace] [--forms] [--ahead-ab B] [--form-ab F] [--one-job-ab 0|1] [--claim-runs-ab R] [--float-form-ab F] [--ab-streams S] [--loads-only-ab] [--unify-ab] [--place near|far]] [--switch N (with a --*-ab option) [--batch-ab S]] [--ahead B] [--one-job 0|1] [--loads-only] [--profile]\n");
            return 2;
        }
    }
    const bool any_ab = ahead_ab >= 0 || form_ab >= 0 || loads_only_ab || one_job_ab >= 0 || float_form_ab >= 0 ||
                        claim_runs_ab > 0 || unify_ab || batch_ab;
    if (sw && (!any_ab || place >= 0 || trace)) {
        /* one engine's consecutive steps: no placement waits, no per-step probe or profile */
        fprintf(stderr, "ditto bench: --switch %s\n",
                !any_ab ? "needs an option A/B (--ahead-ab, --form-ab, --float-form-ab, --one-job-ab, --claim-runs-ab, --loads-only-ab, --unify-ab or --batch-ab)"
                : place >= 0 ? "does not go with --place" : "does not go with --trace");
        return 2;
    }
    if (batch_ab && (!sw || ab_streams > 1)) {
        /* one engine's steps of one stream and of S; paired on two engines: --streams 1,S --paired N */
        fprintf(stderr, "ditto bench: --batch-ab %s\n",
                !sw ? "needs --switch N (the paired batches with a probe pass: --streams 1,S --paired N)"
                    : "does not go with --ab-streams (its A is one stream, its B the batch)");
        return 2;
    }
    if (ab_streams > 1 && (place >= 0 || float_form_ab >= 0 || unify_ab)) {
        /* batches wait for no placement, the float form changes one-token calls only, and a batch
         * takes the batched path either way */
        fprintf(stderr, "ditto bench: --ab-streams above 1 does not go with %s\n",
                place >= 0 ? "--place"
                : unify_ab ? "--unify-ab (a batch of several rows takes the batched path either way)"
                           : "--float-form-ab (a batch's router calls carry every row)");
        return 2;
    }
    int max_s = 1;
    for (int i = 0; i < n_streams; i++) max_s = DT_MAX(max_s, streams[i]);
    model *m;
    ditto_err err;
    double tl = time_now();
    if (model_load(&m, path, &err)) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        return 1;
    }
    tl = time_now() - tl;
    engine_opts o;
    engine_opts_default(&o);
    o.n_threads = threads;
    o.max_streams = max_s + (paired && max_s > 1); /* paired batches add a solo stream */
    /* a paired run: a warm-up and a measured step per pair; a switched A/B: its pairs and warm-up steps */
    o.ctx = plen + DT_MAX(gen, DT_MAX(2 * paired, 2 * sw + 8)) + 1;
    o.max_rows = DT_MAX(max_s, DT_MIN(plen, chunk)); /* the prefill's rows per forward call */
    o.profile = profile;
    o.cpu_ahead = ahead;
    o.cpu_one_job = one_job;
    o.cpu_loads_only = loads_only; /* a diagnostic: the rows then time the step's structure alone */
    engine *e = NULL, *eu = NULL;
    double tc = time_now();
    if (engine_create(&e, m, &o, &err)) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        model_free(m);
        return 1;
    }
    o.unify = true;
    o.max_streams = 1;
    const int err_eu = engine_create(&eu, m, &o, &err);
    o.unify = false; /* the A/B runs below start from the run's options, each path as it names */
    if (err_eu) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        engine_free(e);
        model_free(m);
        return 1;
    }
    tc = time_now() - tc;
    char arena[256];
    kv_arena_describe(e->kv, arena, sizeof arena);
    /* one buffer for every probe of the run: allocating and faulting 1 GiB before each row
     * would itself disturb the row (page zeroing, and the VM host reclaiming freed memory) */
    bench_probe *probe = bench_probe_create(threads, (size_t)1 << 30);
    double pat[BENCH_PATTERNS] = {0};
    double bw = bench_probe_run(probe, 3, pat);
    uint64_t bpt = model_bytes_per_token(m);
    char cpu[256], pf_form[160], none[64] = "";
    cpu_describe(cpu, sizeof cpu);
    const int form = cpu_stream_select(cpu_level_detect(), -1);
    /* the AVX2 kernels request into L2 only (repack_avx2.c): the pattern is the AVX-512 form's. The
     * plain form makes no requests (the first pattern's loads): bw_task then runs the multi-token
     * kernels' near-far requests, and the line names them */
    const int pat_form = form == CPU_STREAM_TWO_L1 ? CPU_STREAM_TWO_L1 : CPU_STREAM_NEAR_FAR;
    if (cpu_stream_no_requests(form))
        snprintf(none, sizeof none, "%s makes none, so the multi-token kernels' ", cpu_stream_name((enum cpu_stream)form));
    snprintf(pf_form, sizeof pf_form, "%s%s%s: %d B ahead to %s and %d B to %s; 0 = none",
             cpu_level_detect() < CPU_AVX512 ? "the AVX-512 kernels' " : "", none, cpu_stream_name(pat_form),
             CPU_FORM_DIST(pat_form), CPU_PF_HINT == _MM_HINT_T0 ? "L1" : "L2", CPU_FORM_FAR(pat_form),
             CPU_PF_FAR_HINT == _MM_HINT_T0 ? "L1" : "L2");
    char mem[160];
    e->be->memory(e->be_state, mem, sizeof mem);
    printf("# ditto bench\n\nmodel: %s (%.2fB params, open %.2f s, weights prepared + arenas in %.2f s)\ncpu: %s\nbackend: "
           "%s\n%s\n%s\n",
           path, (double)m->n_params / 1e9, tl, tc, cpu, e->be->describe(e->be_state), mem, arena);
    printf("machine read bandwidth (%d thread%s, 256-bit loads, 1-8 interleaved streams per thread, no software prefetch or to L1 1 KiB or as the kernels (%s), 1 GiB on huge pages, best of %d): %.2f GB/s\n",
           threads, threads > 1 ? "s" : "", pf_form,
           3 * BENCH_PATTERNS, bw);
    printf("  by streams per thread, prefetch none / L1 1 KiB / kernels':");
    for (int i = 0; i < BENCH_PATTERNS; i += 3)
        printf("%s %d: %.2f / %.2f / %.2f", i ? "," : "", 1 << (i / 3), pat[i], pat[i + 1], pat[i + 2]);
    printf(" GB/s (the bound uses the best)\n");
    printf("weights read per decoded token (solo): %.1f MiB -> bandwidth bound %.1f tok/s\n\n", bpt / 1048576.0,
           bw * 1e9 / (double)bpt);
    /* warm the weights into the page cache, then prefill */
    uint64_t rng = 1;
    int32_t last;
    int slot = kv_slot_acquire(e->kv);
    if (prefill(e, slot, DT_MIN(plen, 8), &rng, &last, &err) < 0) goto fail;
    kv_slot_release(e->kv, slot);
    slot = kv_slot_acquire(e->kv);
    backend_stage pf0[BENCH_STAGES], pf1[BENCH_STAGES];
    const int npf = profile ? DT_MIN(e->be->profile(e->be_state, pf0, BENCH_STAGES), BENCH_STAGES) : 0;
    double tp = prefill(e, slot, plen, &rng, &last, &err);
    if (tp < 0) goto fail;
    kv_slot_release(e->kv, slot);
    printf("prefill: %d tokens in %.3f s = %.1f tok/s (chunks of %d)\n\n", plen, tp, plen / tp, o.max_rows);
    if (npf > 0 && e->be->profile(e->be_state, pf1, BENCH_STAGES) > 0) print_prefill_profile(pf0, pf1, npf, tp);
    /* "% of bw" is against the probe above; the machine's bandwidth drifts (a shared VM
     * swings by tens of percent over minutes), so each row is also compared with a probe
     * run right before and right after it (one pass of each pattern): "% of adj." uses the larger. */
    printf("| streams | path | step ms | aggregate tok/s | per-stream tok/s | weight MiB/step | KV MiB/step | GB/s | %% of bw | adj. probe GB/s | %% of adj. |\n");
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    backend_calls cc0[BENCH_CALL_KINDS], cc1[BENCH_CALL_KINDS];
    const int ncc = profile ? DT_MIN(e->be->calls(e->be_state, cc0, BENCH_CALL_KINDS), BENCH_CALL_KINDS) : 0;
    double agg[17][100], adj[17][100], prb[17][100]; /* [row][repeat] */
    static bench_row first[17];        /* the first repeat's rows, for the profile */
    int rows = 0;
    for (int rep = 0; rep < repeat; rep++) {
        rows = 0;
        for (int i = 0; i < n_streams + 1; i++) {
            bench_row r;
            bool u = i == n_streams;
            if (u && !(streams[0] == 1 || unify)) break;
            int S = u ? 1 : streams[i];
            engine *eng = u ? eu : e;
            if (!u && unify && S == 1) continue; /* shown as the unify row */
            double bw0 = bench_probe_run(probe, 1, NULL);
            if (decode_run(eng, S, plen, gen, 1000 + (uint64_t)i, &r, &err) < 0) goto fail;
            double bwa = DT_MAX(bw0, bench_probe_run(probe, 1, NULL));
            printf("| %d | %s | %.2f | %.2f | %.2f | %.1f | %.2f | %.2f | %.0f%% | %.1f | %.0f%% |\n", S,
                   u ? "unify (batched)" : (S == 1 ? "solo" : "batched"), r.step_ms, r.agg, r.per_stream,
                   r.wbytes / 1048576.0, r.kvbytes / 1048576.0, r.gbs, 100.0 * r.gbs / bw, bwa, 100.0 * r.gbs / bwa);
            r.label = u ? "unify" : (S == 1 ? "solo" : "streams");
            if (rep == 0) first[i] = r;
            agg[i][rep] = r.agg;
            adj[i][rep] = 100.0 * r.gbs / bwa;
            prb[i][rep] = bwa;
            rows = i + 1;
        }
    }
    if (repeat > 1) summary(streams, n_streams, rows, repeat, unify, agg, adj, prb);
    if (profile) print_profile(first, rows);
    if (ncc > 0 && e->be->calls(e->be_state, cc1, BENCH_CALL_KINDS) > 0)
        print_calls(cc0, cc1, ncc, "in the rows above (their prompts' prefill too: the calls of over 8 tokens; the"
                                     " unify row's engine aside)");
    if (paired) {
        engine *pe[2] = {e, eu};
        paired_out po;
        const char *const names[2] = {"solo", "unify"};
        if (paired_run(pe, names, 2, probe, plen, paired, trace, place, &po, &err) < 0) goto fail;
        printf("\npaired (%d decode steps of one stream per path, the two paths' steps back to back in alternating order,"
               " after an unmeasured warm-up step of each, each pair followed by one pass of the probe's %d patterns):"
               " step read rate %% of the best pattern right after it\n\n",
               paired, BENCH_PATTERNS);
        printf("| path | median | quartiles | median tok/s | vs pattern 1 / 2 / 4 / 8 streams per thread, prefetch none |"
               " L1 1 KiB | kernels' |\n|---|---:|---|---:|---|---|---|\n");
        for (int k = 0; k < 2; k++) {
            const double *b = po.by_pattern[k];
            printf("| %s | %.0f%% | %.0f–%.0f%% | %.2f | %.0f / %.0f / %.0f / %.0f%% | %.0f / %.0f / %.0f / %.0f%% | %.0f / %.0f / %.0f / %.0f%% |\n",
                   k ? "unify (batched)" : "solo", po.q[k][1], po.q[k][0], po.q[k][2],
                   po.tps[k], b[0], b[3], b[6], b[9], b[1], b[4], b[7], b[10], b[2], b[5], b[8], b[11]);
        }
        printf("\nby the probe right after each pair, split at %.1f GB/s (midway between the lowest, %.1f, and the highest, %.1f):",
               po.split, po.probe_lo, po.probe_hi);
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 2; h++) {
                printf("%s %s %s: ", h ? "," : k ? ";" : "", k ? "unify" : "solo", h ? "above" : "below");
                if (po.phase_n[k][h]) printf("%.0f%% (%d steps)", po.phase[k][h], po.phase_n[k][h]);
                else printf("no steps");
            }
        printf("\n");
        if (po.waited > 0) printf("\n%.0f s waited for the placement asked for (--place)", po.waited);
        printf("\nby the threads' placement (a cache line's round trip between two probe threads right after each pair, %.0f–%.0f"
               " ns; far: over %d ns, the threads on two core complexes):", po.rtt_lo, po.rtt_hi, BENCH_RTT_FAR_NS);
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < 2; h++) {
                printf("%s %s %s: ", h ? "," : k ? ";" : "", k ? "unify" : "solo", h ? "far" : "near");
                if (po.place_n[h])
                    printf("%.0f%% of the best pattern, %.0f%% of the pass (%d steps)", po.place[k][h], po.place_ctl[k][h],
                           po.place_n[h]);
                else printf("no steps");
            }
        printf("\n");
        printf("\nagainst one load-only pass of a solo step's bytes right after each pair (the first pattern, one stream a"
               " thread with no software prefetch, for the step's length where each pattern above reads 1 GiB): solo %.0f%%"
               " (%.0f–%.0f%%), unify %.0f%% (%.0f–%.0f%%); the pass itself read %.0f%% (%.0f–%.0f%%) of the best pattern\n",
               po.ctl[0][1], po.ctl[0][0], po.ctl[0][2], po.ctl[1][1], po.ctl[1][0], po.ctl[1][2], po.ctl_best[1],
               po.ctl_best[0], po.ctl_best[2]);
        printf("\nunify / solo, median of the per-step paired ratios: %.3f (quartiles %.3f–%.3f); logits bitwise equal at"
               " every step: %s\n",
               po.ratio_med, po.rate_q[0], po.rate_q[2], po.same ? "yes" : "NO");
        bool head = false;
        static paired_batch_out pbs[17];
        static backend_calls pcc[17][2][BENCH_CALL_KINDS]; /* each S's calls profile before / after its pairs */
        int npb = 0, pb_streams[17];
        for (int i = 0; i < n_streams && !unify; i++) {
            if (streams[i] < 2) continue;
            paired_batch_out *pb = &pbs[npb];
            if (ncc > 0) e->be->calls(e->be_state, pcc[npb][0], BENCH_CALL_KINDS);
            pb_streams[npb++] = streams[i];
            if (paired_batch_run(e, probe, streams[i], plen, paired, pb, &err) < 0) goto fail;
            if (ncc > 0) e->be->calls(e->be_state, pcc[npb - 1][1], BENCH_CALL_KINDS);
            if (!head)
                printf("\npaired batches (%d steps of one solo stream and of S streams in one batch, back to back in"
                       " alternating order, after an unmeasured warm-up step of each, each pair followed by one probe"
                       " pass; row 0 of the batch has the solo stream's prompt; all steps = the aggregate rates over"
                       " all the steps)\n\n"
                       "| streams | solo %% of probe | batch %% of probe (quartiles) | solo tok/s | batch tok/s |"
                       " x solo, per pair (quartiles) | x solo, all steps | row 0 = solo, bitwise |\n"
                       "|---:|---:|---|---:|---:|---|---:|---|\n", paired);
            head = true;
            printf("| %d | %.0f%% | %.0f%% (%.0f–%.0f%%) | %.2f | %.2f | %.2f (%.2f–%.2f) | %.2f | %s |\n", streams[i],
                   pb->q[0][1], pb->q[1][1], pb->q[1][0], pb->q[1][2], pb->tps[0], pb->tps[1], pb->x[1], pb->x[0],
                   pb->x[2], pb->x_all, pb->same ? "yes" : "NO");
        }
        if (profile) print_paired_profile(pbs, pb_streams, npb, paired);
        for (int i = 0; i < npb && ncc > 0; i++) {
            char what[96];
            snprintf(what, sizeof what, "in the paired steps of one stream and of %d (their prompts' prefill too)",
                     pb_streams[i]);
            print_calls(pcc[i][0], pcc[i][1], ncc, what);
        }
    }
    if (paired && forms && forms_run(m, &o, probe, plen, paired, trace, place, &err) < 0) goto fail;
    const ab_args ab = {probe, plen, paired, place, ab_streams, trace, sw};
    const bool run_ab = paired || sw;
    if (run_ab && ahead_ab >= 0 && ahead_run(m, &o, ahead_ab, &ab, &err) < 0) goto fail;
    if (run_ab && form_ab >= 0 && form_run(m, &o, form_ab, false, &ab, &err) < 0) goto fail;
    if (run_ab && loads_only_ab && loads_only_run(m, &o, &ab, &err) < 0) goto fail;
    if (run_ab && one_job_ab >= 0 && one_job_run(m, &o, one_job_ab, &ab, &err) < 0) goto fail;
    if (run_ab && float_form_ab >= 0 && form_run(m, &o, float_form_ab, true, &ab, &err) < 0) goto fail;
    if (run_ab && claim_runs_ab > 0 && claim_runs_run(m, &o, claim_runs_ab, &ab, &err) < 0)
        goto fail;
    if (run_ab && unify_ab && unify_run(m, &o, &ab, &err) < 0) goto fail;
    if (run_ab && batch_ab && batch_switch_run(m, &o, batch_ab, &ab, &err) < 0) goto fail;
    bench_probe_free(probe);
    engine_free(eu);
    engine_free(e);
    model_free(m);
    return 0;
fail:
    fprintf(stderr, "ditto bench: %s\n", err.msg);
    bench_probe_free(probe);
    engine_free(eu);
    engine_free(e);
    model_free(m);
    return 1;
}
