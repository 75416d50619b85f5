/* pool.c — persistent workers woken per job by a generation counter; they spin
 * (up to the pool's spin limit, POOL_SPIN_S unless pool_set_spin) before sleeping on a
 * condition variable. */
#include "pool.h"

#include <float.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <immintrin.h>

#include "common.h"

/* Spins while *v == eq (eq_mode) or while *v != 0 (!eq_mode), for at most limit
 * seconds; returns the last value read. While idle is set, each turn of the
 * spin runs one call of it instead of a pause, until it returns false. Past
 * POOL_YIELD_S it yields the core every 64 turns, so that with more threads than
 * free cores the thread waited for gets to run (spinning alone held the core for a
 * whole time slice per wait: 80x slower steps at 3 threads on 2 cores). */
static unsigned spin_on(atomic_uint *v, bool eq_mode, unsigned eq, pool_idle_fn idle, void *idle_ctx, int ith,
                        double limit) {
    double t0 = 0.0;
    for (unsigned i = 0;; i++) {
        unsigned x = atomic_load_explicit(v, memory_order_acquire);
        if (eq_mode ? x != eq : x == 0) return x;
        if (idle) {
            if (!idle(idle_ctx, ith)) idle = NULL;
            continue;
        }
        if ((i & 63) == 63) {
            double t = time_now();
            if (t0 == 0.0)
                t0 = t;
            else if (t - t0 > limit)
                return x;
            else if (t - t0 > POOL_YIELD_S) {
                sched_yield();
                continue;
            }
        }
        _mm_pause();
    }
}

struct pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint gen;      /* incremented per job */
    atomic_uint pending;  /* workers still running the job */
    bool quit;
    pool_fn fn;
    void *ctx;
    pool_idle_fn idle; /* of the current job, NULL for none */
    void *idle_ctx;
    _Atomic double spin; /* seconds a waiting thread spins before it sleeps */
    /* pool_barrier: arrivals and generation on one line (two threads: two line transfers a barrier) */
    struct {
        atomic_uint count, gen;
    } __attribute__((aligned(64))) bar;
};

typedef struct worker_arg {
    pool *p;
    int ith;
} worker_arg;

static void *worker(void *arg) {
    worker_arg *wa = arg;
    pool *p = wa->p;
    int ith = wa->ith;
    free(wa);
    unsigned seen = 0;
    pool_idle_fn idle = NULL;
    void *idle_ctx = NULL;
    for (;;) {
        unsigned g = spin_on(&p->gen, true, seen, idle, idle_ctx, ith, atomic_load_explicit(&p->spin, memory_order_relaxed));
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !p->quit) pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (p->quit) return NULL;
        seen = g;
        idle = p->idle, idle_ctx = p->idle_ctx;
        p->fn(p->ctx, ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

pool *pool_create(int n_threads) {
    DT_ASSERT(n_threads >= 1);
    pool *p = xaligned(sizeof *p); /* bar on a line of its own */
    memset(p, 0, sizeof *p);
    p->n = n_threads;
    atomic_init(&p->spin, POOL_SPIN_S);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = xcalloc((size_t)n_threads, sizeof(pthread_t));
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = xmalloc(sizeof *wa);
        wa->p = p;
        wa->ith = i;
        DT_ASSERT(pthread_create(&p->threads[i], NULL, worker, wa) == 0);
    }
    return p;
}

void pool_free(pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int pool_size(const pool *p) { return p->n; }

void pool_barrier(pool *p) {
    if (p->n == 1) return;
    const unsigned g = atomic_load_explicit(&p->bar.gen, memory_order_acquire);
    if (atomic_fetch_add_explicit(&p->bar.count, 1, memory_order_acq_rel) == (unsigned)p->n - 1) {
        atomic_store_explicit(&p->bar.count, 0, memory_order_relaxed);
        atomic_store_explicit(&p->bar.gen, g + 1, memory_order_release);
        return;
    }
    spin_on(&p->bar.gen, true, g, NULL, NULL, 0, DBL_MAX);
}

void pool_set_spin(pool *p, double seconds) {
    DT_ASSERT(seconds >= 0.0);
    atomic_store_explicit(&p->spin, seconds, memory_order_relaxed);
}

void pool_run(pool *p, pool_fn fn, void *ctx) { pool_run_idle(p, fn, ctx, NULL, NULL); }

void pool_run_idle(pool *p, pool_fn fn, void *ctx, pool_idle_fn idle, void *idle_ctx) {
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->idle = idle;
    p->idle_ctx = idle_ctx;
    atomic_store(&p->pending, p->n - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    if (spin_on(&p->pending, false, 0, idle, idle_ctx, 0, atomic_load_explicit(&p->spin, memory_order_relaxed)) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
