/* test_claim.c — segmented work claiming (src/cpu/claim.c): under real concurrency, with
 * threads delayed at random or one thread absent, every unit is handed out exactly once;
 * runs are non-empty; each thread's own runs are consecutive from its segment's start; a
 * lone thread takes its whole segment front to back, each run half of what is left but at most
 * the cap; others steal only from backs. Stages
 * inside one pool job, each thread setting up its own segment (claim_reset_own) with a barrier
 * between stages, hand out every unit of every stage exactly once. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"
#include "cpu/claim.h"
#include "pool.h"
#include "test.h"

#define MAXT 8
#define MAXRUNS 4096

typedef struct run {
    int u0, u1;
    bool own;
} run;

typedef struct ctx {
    claim_set *c;
    int ith, total, delay_us; /* delay: before the first claim; then a short spin now and then (jitter) */
    uint64_t seed;
    run runs[MAXRUNS];
    int n_runs, out_of_range;
    _Atomic int *hits;
} ctx;

static void spin_us(int us) {
    const double t0 = time_now();
    while ((time_now() - t0) * 1e6 < us) {
    }
}

static void *worker(void *arg) {
    ctx *x = arg;
    if (x->delay_us) spin_us(x->delay_us);
    int a, b;
    bool own;
    while (claim_next(x->c, x->ith, &a, &b, &own)) {
        if (x->n_runs < MAXRUNS) x->runs[x->n_runs++] = (run){a, b, own};
        if (a < 0 || b > x->total) {
            x->out_of_range++;
            continue;
        }
        for (int u = a; u < b; u++) atomic_fetch_add_explicit(&x->hits[u], 1, memory_order_relaxed);
        x->seed = x->seed * 6364136223846793005ULL + 1442695040888963407ULL;
        if ((x->seed >> 60) == 0) sched_yield();
        else if (x->delay_us && (x->seed >> 60) == 1) spin_us(1 + (int)((x->seed >> 40) % 8));
    }
    return NULL;
}

/* Runs one stage of `total` units on nth threads (thread `absent` never claims; -1: none)
 * and checks the hand-out. Returns the number of stolen runs. */
static int stage(claim_set *c, int nth, int total, int absent, int delay_us, uint64_t seed) {
    _Atomic int *hits = calloc((size_t)total + 1, sizeof *hits);
    static ctx xs[MAXT];
    claim_reset(c, total);
    pthread_t th[MAXT];
    for (int i = 0; i < nth; i++) {
        xs[i] = (ctx){.c = c, .ith = i, .total = total, .delay_us = i == 0 ? 0 : (int)((seed >> (4 * i)) % (unsigned)(delay_us + 1)),
                      .seed = seed + (uint64_t)i, .hits = hits};
        if (i != absent) pthread_create(&th[i], NULL, worker, &xs[i]);
    }
    for (int i = 0; i < nth; i++)
        if (i != absent) pthread_join(th[i], NULL);
    int bad = 0, steals = 0, own_bad = 0, empty = 0, oob = 0;
    for (int u = 0; u < total; u++) bad += atomic_load(&hits[u]) != 1;
    for (int i = 0; i < nth; i++) {
        if (i == absent) continue;
        oob += xs[i].out_of_range;
        int next = (int)((long long)total * i / nth); /* own runs: consecutive from the segment start */
        for (int r = 0; r < xs[i].n_runs; r++) {
            const run *q = &xs[i].runs[r];
            empty += q->u1 <= q->u0;
            if (q->own) {
                own_bad += q->u0 != next || q->u1 > claim_seg_end(c, i);
                next = q->u1;
            } else {
                steals++;
            }
        }
    }
    CHECK(bad == 0 && oob == 0, "nth %d total %d absent %d: %d units not handed out exactly once, %d runs out of range",
          nth, total, absent, bad, oob);
    CHECK(empty == 0 && own_bad == 0, "nth %d total %d: %d empty runs, %d own runs out of order", nth, total, empty, own_bad);
    free(hits);
    return steals;
}

/* Stages in one job: stage s has stage_total(s) units (0 and 1 among them); every thread resets
 * its own segment, claims, counts each unit it got (a thread of its own is late now and then),
 * then waits at the barrier. */
#define JSTAGES 300
#define JMAX 257
typedef struct job_stages {
    pool *p;
    claim_set c;
    _Atomic int got[JSTAGES][JMAX];
    _Atomic int bad;
} job_stages;
static int stage_total(int s) { return (s * 37 + 11) % JMAX * (s % 5 != 0); }

static void stages_fn(void *ctx, int ith, int nth) {
    job_stages *j = ctx;
    (void)nth;
    for (int s = 0; s < JSTAGES; s++) {
        if ((s + ith) % 7 == 0)
            for (volatile int k = 0; k < 3000; k++) {
            }
        const int total = stage_total(s);
        claim_reset_own(&j->c, total, ith);
        int a, b;
        bool own;
        while (claim_next(&j->c, ith, &a, &b, &own))
            for (int u = a; u < b; u++) {
                if (u < 0 || u >= total) atomic_fetch_add(&j->bad, 1);
                else atomic_fetch_add(&j->got[s][u], 1);
            }
        pool_barrier(j->p);
    }
}

int main(void) {
    static const int totals[] = {0, 1, 2, 3, 7, 8, 9, 31, 100, 1000, 20000};
    uint64_t seed = 0x9E3779B97F4A7C15ULL;
    for (int nth = 1; nth <= MAXT; nth++) {
        claim_set c;
        claim_init(&c, nth);
        for (size_t t = 0; t < sizeof totals / sizeof *totals; t++)
            for (int rep = 0; rep < 4; rep++) {
                seed = seed * 6364136223846793005ULL + 1;
                stage(&c, nth, totals[t], -1, rep * 50, seed);
            }
        claim_free(&c);
    }

    /* a lone thread: its own segment front to back in runs of half of what is left, at most
     * an eighth of the segment (CLAIM_RUNS), then the others' backs under the same rule */
    enum { LT = 1024, LSEG = LT / 4, LCAP = LSEG / CLAIM_RUNS };
    claim_set c;
    claim_init(&c, 4);
    claim_reset(&c, LT);
    int a, b, n = 0, first = -1, last_own = -1;
    bool own, order_ok = true;
    int next = 0, backs[4] = {LSEG, 2 * LSEG, 3 * LSEG, LT}, handed = 0;
    while (claim_next(&c, 0, &a, &b, &own) && n < 4 * LT) {
        n++;
        handed += b - a;
        if (first < 0) first = b - a;
        if (own) {
            const int left = LSEG - a;
            order_ok &= a == next && b - a == DT_MIN(LCAP, DT_MAX(1, left / 2));
            next = b;
            last_own = b - a;
        } else { /* steals: from the back of the fullest other segment */
            int s = a / LSEG, fullest = 1;
            for (int t = 2; t < 4; t++)
                if (backs[t] - LSEG * t > backs[fullest] - LSEG * fullest) fullest = t;
            const int left = backs[s] - LSEG * s;
            order_ok &= s == fullest && b == backs[s] && b - a == DT_MIN(LCAP, DT_MAX(1, left / 2));
            backs[s] = a;
        }
    }
    order_ok &= handed == LT;
    for (int s = 1; s < 4; s++) order_ok &= backs[s] == LSEG * s;
    CHECK(first == LCAP && last_own == 1 && next == LSEG, "lone thread own runs: first %d, last %d, own end %d", first,
          last_own, next);
    CHECK(order_ok, "lone thread: runs out of order or of the wrong size");

    /* a run cap set before the reset (engine option cpu_claim_runs): 1 / runs of the segment */
    const int run_caps[] = {3, 4, 256}; /* first runs of 86, 64 and 1 units (runs 1 and 2 both give half) */
    for (int i = 0; i < 3; i++) {
        c.runs = run_caps[i];
        claim_reset(&c, LT);
        const int cap = (LSEG + c.runs - 1) / c.runs;
        CHECK(claim_next(&c, 0, &a, &b, &own) && own && a == 0 && b - a == DT_MIN(cap, LSEG / 2),
              "runs %d: first own run [%d, %d), cap %d", c.runs, a, b, cap);
        handed = b - a;
        for (int guard = 0; guard < 4 * LT && claim_next(&c, 0, &a, &b, &own); guard++) handed += b - a;
        CHECK(handed == LT, "runs %d: %d of %d units handed out", c.runs, handed, LT);
    }
    claim_free(&c);

    /* one thread never shows up: the others take all of its segment, by stealing */
    for (int nth = 2; nth <= 4; nth++)
        for (int absent = 0; absent < nth; absent += nth - 1) {
            claim_set d;
            claim_init(&d, nth);
            int steals = stage(&d, nth, 1000, absent, 0, seed + (uint64_t)nth);
            CHECK(steals > 0, "nth %d with thread %d absent: no steals", nth, absent);
            claim_free(&d);
        }
    /* stages inside one pool job, each thread resetting its own segment */
    for (int nth = 2; nth <= 4; nth++) {
        static job_stages js;
        memset(&js, 0, sizeof js);
        js.p = pool_create(nth);
        claim_init(&js.c, nth);
        pool_run(js.p, stages_fn, &js);
        int wrong = 0;
        for (int s = 0; s < JSTAGES; s++)
            for (int u = 0; u < JMAX; u++) wrong += atomic_load(&js.got[s][u]) != (u < stage_total(s));
        CHECK(wrong == 0 && atomic_load(&js.bad) == 0, "nth %d: stages in one job: %d units not handed out once, %d out of range",
              nth, wrong, atomic_load(&js.bad));
        claim_free(&js.c);
        pool_free(js.p);
    }
    return test_summary();
}
