/* bench_mem.c — how fast the machine streams memory in the access patterns the decode kernels
 * could use: S interleaved sequential streams per thread, each consumed G bytes at a time in
 * turn (256-bit loads), with software prefetch D bytes ahead in each stream (0: none, the
 * hardware prefetchers only). Prints GB/s, best of REPS passes over a SIZE GiB buffer on
 * transparent huge pages, passes of all configurations alternating (so drift hits all alike).
 * The bench's bandwidth probe (src/bench.c) is the G = 128, D = 1024 column's best row.
 * Each configuration runs twice: loads only, and with work beside the loads (per 32-byte load,
 * WORK rounds of vpmaddubsw + vpaddw into independent accumulators: 4 * WORK vector ops per
 * 64-byte line; the one-token Q4_K kernel's vpdpbusd, ANDs and scale work come to ~5.5 per line,
 * between WORK 1 and 2): whether a stream that computes reads what plain loads read, in each
 * pattern.
 *
 *   cc -std=c11 -D_GNU_SOURCE -O2 -mavx2 -o /tmp/bench_mem bench/bench_mem.c -pthread
 *   /tmp/bench_mem [THREADS=2] [REPS=3] [SIZE_GIB=1] [WORK=1]
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
    int streams, gran, dist, ith, nth, work;
    uint64_t sink;
} task;

static void *run(void *arg) {
    task *c = arg;
    const size_t per = c->bytes / (size_t)c->nth, base = per * (size_t)c->ith, g = (size_t)c->gran;
    const size_t steps = per / (size_t)c->streams / g, span = steps * g;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, m0 = a0, m1 = a0, m2 = a0, m3 = a0;
    const __m256i k8 = _mm256_set1_epi8(3), k8b = _mm256_set1_epi8(5);
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
                const __m256i v0 = _mm256_load_si256(p), v1 = _mm256_load_si256(p + 1);
                const __m256i v2 = _mm256_load_si256(p + 2), v3 = _mm256_load_si256(p + 3);
                a0 = _mm256_xor_si256(a0, v0);
                a1 = _mm256_xor_si256(a1, v1);
                a2 = _mm256_xor_si256(a2, v2);
                a3 = _mm256_xor_si256(a3, v3);
                for (int w = 0; w < c->work; w++) {
                    const __m256i k = w & 1 ? k8b : k8;
                    m0 = _mm256_add_epi16(m0, _mm256_maddubs_epi16(v0, k));
                    m1 = _mm256_add_epi16(m1, _mm256_maddubs_epi16(v1, k));
                    m2 = _mm256_add_epi16(m2, _mm256_maddubs_epi16(v2, k));
                    m3 = _mm256_add_epi16(m3, _mm256_maddubs_epi16(v3, k));
                }
            }
        }
    a0 = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
    a0 = _mm256_xor_si256(a0, _mm256_xor_si256(_mm256_xor_si256(m0, m1), _mm256_xor_si256(m2, m3)));
    c->sink = (uint64_t)_mm256_extract_epi64(a0, 0);
    return NULL;
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 3;
    const size_t bytes = (size_t)(argc > 3 ? atof(argv[3]) : 1.0) * ((size_t)1 << 30) & ~(((size_t)2 << 20) - 1);
    const int work = argc > 4 ? atoi(argv[4]) : 1;
    if (nth < 1 || nth > 64 || reps < 1 || bytes == 0 || work < 1 || work > 64) {
        fprintf(stderr, "usage: bench_mem [THREADS=2] [REPS=3] [SIZE_GIB=1] [WORK=1]\n");
        return 2;
    }
    uint8_t *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) return 1;
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    const int S[] = {1, 2, 4, 8}, G[] = {128, 2304, 4608}, D[] = {0, 1024, 4096};
    enum { NS = 4, NG = 3, ND = 3 };
    double best[2][NS][NG][ND] = {{{{0}}}};
    task *t = calloc((size_t)nth, sizeof *t);
    pthread_t *th = calloc((size_t)nth, sizeof *th);
    for (int r = 0; r < reps; r++)
        for (int si = 0; si < NS; si++)
            for (int gi = 0; gi < NG; gi++)
                for (int di = 0; di < ND * 2; di++) {
                    const int wk = di / ND ? work : 0;
                    for (int i = 0; i < nth; i++) t[i] = (task){buf, bytes, S[si], G[gi], D[di % ND], i, nth, wk, 0};
                    const double t0 = now();
                    for (int i = 1; i < nth; i++) pthread_create(&th[i], NULL, run, &t[i]);
                    run(&t[0]);
                    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
                    const double gbs = (double)bytes / (now() - t0) / 1e9;
                    if (gbs > best[di / ND][si][gi][di % ND]) best[di / ND][si][gi][di % ND] = gbs;
                }
    printf("bench_mem: %d threads, %.2f GiB on huge pages, best of %d; GB/s, loads only / with work %d\n\n", nth,
           (double)bytes / (1 << 30), reps, work);
    printf("| streams per thread | bytes per turn | no prefetch | prefetch 1 KiB | prefetch 4 KiB |\n|---:|---:|---:|---:|---:|\n");
    double top[2] = {0, 0};
    for (int si = 0; si < NS; si++)
        for (int gi = 0; gi < NG; gi++) {
            printf("| %d | %d |", S[si], G[gi]);
            for (int di = 0; di < ND; di++) {
                printf(" %.1f / %.1f |", best[0][si][gi][di], best[1][si][gi][di]);
                for (int w = 0; w < 2; w++) top[w] = top[w] > best[w][si][gi][di] ? top[w] : best[w][si][gi][di];
            }
            printf("\n");
        }
    printf("\nbest pattern: loads only %.1f, with work %.1f GB/s (%.0f%%)\n", top[0], top[1], 100.0 * top[1] / top[0]);
    free(t), free(th), free(buf);
    return 0;
}
