/* pool.h — a fixed pthread pool. pool_run executes fn(ctx, i, n) on all n
 * threads (the caller is thread 0) and returns when every one has finished.
 * Work must be split by output index only (contract: thread count never
 * changes a result). */
#ifndef DITTO_POOL_H
#define DITTO_POOL_H

#include <stdbool.h>

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int ith, int nth);

pool *pool_create(int n_threads);
void pool_free(pool *p);
int pool_size(const pool *p);
/* How long a waiting thread spins before it sleeps, by default: longer than the gap between two
 * pool jobs of one step (so a decode step never pays a futex wake-up, which costs tens of
 * microseconds in a VM), short enough that an idle server sleeps. A pool's workers go on
 * spinning that long after its last job — on a machine with no spare core they take CPU time
 * from whatever runs next (the bench waits this out before it measures something else). */
#define POOL_SPIN_S 0.002
/* How long a waiting thread (for the next job, or at pool_barrier) spins before it also yields
 * the core as it spins: far above a barrier's wait in a step with a core per thread (~1-30
 * microseconds), far below a time slice. */
#define POOL_YIELD_S 0.00002
/* Sets p's spin limit (seconds >= 0; 0: a waiting thread sleeps at once). */
void pool_set_spin(pool *p, double seconds);
void pool_run(pool *p, pool_fn fn, void *ctx);

/* Work for a thread that waits: idle(idle_ctx, ith) is called again and again by thread ith
 * while it waits — a worker from the end of its part of this job until the next job starts,
 * thread 0 from the end of its part until the workers end theirs — until it returns false. Each
 * call should be short (the wait ends only between calls). It runs beside other threads' work,
 * so it may only request memory (prefetch), never change what a job computes. */
typedef bool (*pool_idle_fn)(void *idle_ctx, int ith);

/* pool_run, each thread then running idle as above; idle_ctx must stay valid and unchanged
 * (but for what idle itself writes of thread ith's part) until the next pool_run returns. */
void pool_run_idle(pool *p, pool_fn fn, void *ctx, pool_idle_fn idle, void *idle_ctx);

/* Inside a job: returns once all of p's threads have called it (a spin barrier; every write a
 * thread made before its call is visible to every thread after theirs). Every thread of the
 * job must call it the same number of times. */
void pool_barrier(pool *p);

/* [lo, hi) of n items for thread ith of nth, rounded to multiples of `align`. */
static inline void pool_split(int n, int align, int ith, int nth, int *lo, int *hi) {
    int units = (n + align - 1) / align;
    int a = (int)((long long)units * ith / nth) * align;
    int b = (int)((long long)units * (ith + 1) / nth) * align;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

#endif
