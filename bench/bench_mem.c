/* bench_mem.c — how fast the machine streams memory in the access patterns the decode kernels
 * could use: S interleaved sequential streams per thread, each consumed G bytes at a time in
 * turn (256-bit loads), with software prefetch D bytes ahead in each stream (0: none, the
 * hardware prefetchers only). Prints GB/s, best of REPS passes over a SIZE GiB buffer on
 * transparent huge pages, passes of all configurations alternating (so drift hits all alike).
 * The bench's bandwidth probe (src/bench.c) is the G = 128, D = 1024 column's best row.
 *
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -o /tmp/bench_mem bench/bench_mem.c -pthread
 *   /tmp/bench_mem [THREADS=2] [REPS=3] [SIZE_GIB=1]
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    const uint8_t *buf;
    size_t bytes;
    int streams, gran, dist, ith, nth;
    uint64_t sink;
} task;

static void *run(void *arg) {
    task *c = arg;
    const size_t per = c->bytes / (size_t)c->nth, base = per * (size_t)c->ith, g = (size_t)c->gran;
    const size_t steps = per / (size_t)c->streams / g, span = steps * g;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < steps; i++)
        for (int s = 0; s < c->streams; s++) {
            const uint8_t *q0 = c->buf + base + (size_t)s * span + i * g;
            for (size_t o = 0; o < g; o += 128) {
                const uint8_t *q = q0 + o;
                if (c->dist) {
                    _mm_prefetch((const char *)q + c->dist, _MM_HINT_T0);
                    _mm_prefetch((const char *)q + c->dist + 64, _MM_HINT_T0);
                }
                const __m256i *p = (const __m256i *)(const void *)q;
                a0 = _mm256_xor_si256(a0, _mm256_load_si256(p));
                a1 = _mm256_xor_si256(a1, _mm256_load_si256(p + 1));
                a2 = _mm256_xor_si256(a2, _mm256_load_si256(p + 2));
                a3 = _mm256_xor_si256(a3, _mm256_load_si256(p + 3));
            }
        }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    c->sink = (uint64_t)_mm256_extract_epi64(a0, 0);
    return NULL;
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 3;
    const size_t bytes = (size_t)(argc > 3 ? atof(argv[3]) : 1.0) * ((size_t)1 << 30) & ~(((size_t)2 << 20) - 1);
    if (nth < 1 || nth > 64 || reps < 1 || bytes == 0) {
        fprintf(stderr, "usage: bench_mem [THREADS=2] [REPS=3] [SIZE_GIB=1]\n");
        return 2;
    }
    uint8_t *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) return 1;
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    const int S[] = {1, 2, 4, 8}, G[] = {128, 2304, 4608}, D[] = {0, 1024, 4096};
    enum { NS = 4, NG = 3, ND = 3 };
    double best[NS][NG][ND] = {{{0}}};
    task *t = calloc((size_t)nth, sizeof *t);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    for (int r = 0; r < reps; r++)
        for (int si = 0; si < NS; si++)
            for (int gi = 0; gi < NG; gi++)
                for (int di = 0; di < ND; di++) {
                    for (int i = 0; i < nth; i++) t[i] = (task){buf, bytes, S[si], G[gi], D[di], i, nth, 0};
                    const double t0 = now();
                    for (int i = 1; i < nth; i++) pthread_create(&th[i], NULL, run, &t[i]);
                    run(&t[0]);
                    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
                    const double gbs = (double)bytes / (now() - t0) / 1e9;
                    if (gbs > best[si][gi][di]) best[si][gi][di] = gbs;
                }
    printf("bench_mem: %d threads, %.2f GiB on huge pages, best of %d; GB/s\n\n", nth, (double)bytes / (1 << 30), reps);
    printf("| streams per thread | bytes per turn | no prefetch | prefetch 1 KiB | prefetch 4 KiB |\n|---:|---:|---:|---:|---:|\n");
    for (int si = 0; si < NS; si++)
        for (int gi = 0; gi < NG; gi++)
            printf("| %d | %d | %.1f | %.1f | %.1f |\n", S[si], G[gi], best[si][gi][0], best[si][gi][1], best[si][gi][2]);
    free(t), free(th), free(buf);
    return 0;
}
