/* pool.h — a fixed pthread pool. pool_run executes fn(ctx, i, n) on all n
 * threads (the caller is thread 0) and returns when every one has finished.
 * Work must be split by output index only (contract: thread count never
 * changes a result). */
#ifndef DITTO_POOL_H
#define DITTO_POOL_H

typedef struct pool pool;
typedef void (*pool_fn)(void *ctx, int ith, int nth);

pool *pool_create(int n_threads);
void pool_free(pool *p);
int pool_size(const pool *p);
void pool_run(pool *p, pool_fn fn, void *ctx);

/* [lo, hi) of n items for thread ith of nth, rounded to multiples of `align`. */
static inline void pool_split(int n, int align, int ith, int nth, int *lo, int *hi) {
    int units = (n + align - 1) / align;
    int a = (int)((long long)units * ith / nth) * align;
    int b = (int)((long long)units * (ith + 1) / nth) * align;
    *lo = a < n ? a : n;
    *hi = b < n ? b : n;
}

#endif
