/* test_pool.c — the thread pool (src/pool.c): every job runs once on every thread; the idle
 * work given with a job (pool_run_idle) is called by each thread with its own index while it
 * waits, stops for good once it returns false, and stops when the next job starts (a job run
 * with plain pool_run brings no idle work); a pool whose spin limit is 0 (pool_set_spin) leaves
 * the CPU at once after a job, one with the default spins on for up to POOL_SPIN_S; pool_barrier
 * inside a job holds every thread until all have reached it, round after round. */
#include <stdatomic.h>
#include <time.h>

#include "common.h"
#include "pool.h"
#include "test.h"

#define NT 4

typedef struct job {
    _Atomic int ran[NT], bad_nth;
    double worker_spin_s; /* how long workers (not thread 0) take */
} job;

typedef struct idle {
    _Atomic int calls[NT], bad_ith;
    int limit; /* returns false on call `limit` of a thread (0: never) */
} idle;

static void spin_s(double s) {
    const double t0 = time_now();
    while (time_now() - t0 < s) {
    }
}

static void job_fn(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (nth != NT) atomic_fetch_add(&j->bad_nth, 1);
    if (ith >= 0 && ith < NT) atomic_fetch_add(&j->ran[ith], 1);
    if (ith > 0 && j->worker_spin_s > 0) spin_s(j->worker_spin_s);
}

static bool idle_fn(void *ctx, int ith) {
    idle *d = ctx;
    if (ith < 0 || ith >= NT) {
        atomic_fetch_add(&d->bad_ith, 1);
        return false;
    }
    const int c = atomic_fetch_add(&d->calls[ith], 1) + 1;
    return d->limit == 0 || c < d->limit;
}

/* Rounds of: thread ith writes round r into its slot (thread r % NT after a short spin, so it
 * comes last; every 16th round after one long enough that the others yield as they wait),
 * pool_barrier, every thread checks every slot reads r, pool_barrier again (so no slot is
 * overwritten while another thread still checks it). */
#define BAR_ROUNDS 2000
typedef struct bar_job {
    pool *p;
    _Atomic int slot[NT];
    _Atomic int bad;
} bar_job;

static void bar_fn(void *ctx, int ith, int nth) {
    bar_job *b = ctx;
    for (int r = 1; r <= BAR_ROUNDS; r++) {
        if (ith == r % nth && r % 16 == 0)
            spin_s(3 * POOL_YIELD_S); /* the others' waits pass into pool_barrier's yields */
        else if (ith == r % nth)
            for (volatile int k = 0; k < 2000; k++) {
            }
        atomic_store_explicit(&b->slot[ith], r, memory_order_relaxed);
        pool_barrier(b->p);
        for (int i = 0; i < nth; i++)
            if (atomic_load_explicit(&b->slot[i], memory_order_relaxed) != r) atomic_fetch_add(&b->bad, 1);
        pool_barrier(b->p);
    }
}

/* CPU seconds the process spends over n rounds of (a no-op job on p, then a 4 ms sleep):
 * what p's workers burn spinning after each job, as the main thread only sleeps. */
static double cpu_after_jobs(pool *p, int n) {
    struct timespec a, b;
    job j = {0};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    for (int i = 0; i < n; i++) {
        pool_run(p, job_fn, &j);
        nanosleep(&(struct timespec){.tv_nsec = 4000000}, NULL);
    }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    return (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
}

int main(void) {
    pool *p = pool_create(NT);
    CHECK(pool_size(p) == NT, "pool_size %d", pool_size(p));

    /* plain jobs: once on every thread, many times over */
    job j = {0};
    for (int r = 0; r < 200; r++) pool_run(p, job_fn, &j);
    int all = 1;
    for (int i = 0; i < NT; i++) all &= atomic_load(&j.ran[i]) == 200;
    CHECK(all, "a plain job did not run once per thread per call");
    CHECK(atomic_load(&j.bad_nth) == 0, "a job saw nth != %d", NT);

    /* barriers inside a job: no thread passes one before every thread wrote its slot */
    bar_job bj = {.p = p};
    pool_run(p, bar_fn, &bj);
    pool_run(p, bar_fn, &bj); /* a second job: the barrier's state carries over */
    CHECK(atomic_load(&bj.bad) == 0, "pool_barrier: %d slot reads saw an old round", atomic_load(&bj.bad));

    /* idle work with a limit: each worker calls it exactly `limit` times once left alone;
     * thread 0, whose wait is long (the workers spin 20 ms), as well */
    idle d = {.limit = 50};
    job slow = {.worker_spin_s = 0.02};
    pool_run_idle(p, job_fn, &slow, idle_fn, &d);
    spin_s(0.05);
    int exact = 1;
    for (int i = 0; i < NT; i++) exact &= atomic_load(&d.calls[i]) == d.limit;
    CHECK(exact, "idle calls per thread %d %d %d %d, want %d each", atomic_load(&d.calls[0]), atomic_load(&d.calls[1]),
          atomic_load(&d.calls[2]), atomic_load(&d.calls[3]), d.limit);
    CHECK(atomic_load(&d.bad_ith) == 0, "idle called with a thread index out of range");
    for (int i = 0; i < NT; i++) CHECK(atomic_load(&slow.ran[i]) == 1, "slow job on thread %d ran %d times", i, atomic_load(&slow.ran[i]));

    /* idle work that never ends stops at the next job, and a plain job brings none */
    idle forever = {.limit = 0};
    job quick = {0};
    pool_run_idle(p, job_fn, &quick, idle_fn, &forever);
    spin_s(0.05);
    int busy = 1;
    for (int i = 1; i < NT; i++) busy &= atomic_load(&forever.calls[i]) > 0;
    CHECK(busy, "a worker left alone did not call its idle work");
    pool_run(p, job_fn, &quick);
    int snap[NT];
    for (int i = 0; i < NT; i++) snap[i] = atomic_load(&forever.calls[i]);
    spin_s(0.01);
    int still = 1;
    for (int i = 0; i < NT; i++) still &= atomic_load(&forever.calls[i]) == snap[i];
    CHECK(still, "idle work went on after the next job (which brought none)");
    for (int i = 0; i < NT; i++) CHECK(atomic_load(&quick.ran[i]) == 2, "quick job on thread %d ran %d times", i, atomic_load(&quick.ran[i]));

    /* one thread: the job runs inline and no idle work is called */
    pool *one = pool_create(1);
    idle none = {.limit = 5};
    job solo = {0};
    pool_run_idle(one, job_fn, &solo, idle_fn, &none);
    CHECK(atomic_load(&solo.ran[0]) == 1, "one-thread job ran %d times", atomic_load(&solo.ran[0]));
    CHECK(atomic_load(&none.calls[0]) == 0, "one thread called idle work %d times", atomic_load(&none.calls[0]));
    pool_free(one);
    pool_free(p);

    /* the spin limit: NT - 1 workers spin up to POOL_SPIN_S after each of 100 jobs by default
     * (up to 0.6 s of CPU here), and sleep at once with a limit of 0 */
    pool *sp = pool_create(NT);
    const double spun = cpu_after_jobs(sp, 100);
    pool_set_spin(sp, 0.0);
    const double rested = cpu_after_jobs(sp, 100);
    pool_free(sp);
    CHECK(spun > 0.25 * 100 * POOL_SPIN_S, "default spin: %.3f s of CPU after 100 jobs, want > %.3f", spun,
          0.25 * 100 * POOL_SPIN_S);
    CHECK(rested < 0.5 * spun, "spin limit 0: %.3f s of CPU after 100 jobs, against %.3f with the default", rested, spun);
    return test_summary();
}
