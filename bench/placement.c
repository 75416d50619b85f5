/* placement.c — how far apart the two vCPUs sit, beside what the machine reads, over time; and
 * what cutting a stream into model-sized pieces costs in each placement.
 *
 *   bench/placement.sh [ROUNDS=150] [chop]
 *
 * Each round: thread 0 (CPU 0) and thread 1 (CPU 1) hand a counter back and forth through one
 * cache line 20000 times (the round trip, ns; over BENCH_RTT_FAR_NS (src/bench.h), the
 * threads sit on two core complexes), then both read a 531 MB buffer (huge pages where given) with
 * 256-bit loads and no software prefetch, each thread one contiguous half ("contiguous", GB/s).
 * With `chop`, also as 300 pieces of 1.77 MB (one expert's gate+up pair of the 30B-A3B geometry in
 * Q4_K), each thread its half of piece k, then both wait for each other ("barrier": the model's
 * stages), and the same halves back to back ("no barrier"). Prints one line per round and the
 * means per placement. On this project's VM the two vCPUs sit on one complex (~50-160 ns; ~34
 * GB/s) or on two (~250-830 ns; ~51-58 GB/s): the "fast phases" of bench/cpu-speed-log.md, whose
 * thirty-fourth session has the figures (far, the barrier cost ~4% and the pieces ~6%). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench.h" /* BENCH_RTT_FAR_NS */

#define PIECES 300
#define PIECE ((size_t)1769472)
#define ROUND_TRIPS 20000u

enum { MODE_RTT, MODE_BARRIER, MODE_NO_BARRIER, MODE_CONTIGUOUS, MODE_COUNT };

typedef struct team {
    _Alignas(64) _Atomic unsigned v; /* the round trip's counter */
    _Alignas(64) _Atomic int gen;    /* job number; -1: quit */
    _Alignas(64) _Atomic int done;   /* the job thread 1 finished last */
    _Alignas(64) _Atomic int bar[2]; /* pieces each thread has finished (barrier mode) */
    _Atomic int mode;
    const uint8_t *buf;
    uint64_t sink[2];
} team;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

__attribute__((target("avx2"))) static uint64_t read_range(const uint8_t *p, size_t n) {
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t o = 0; o < n; o += 64) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + o)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(p + o + 32)));
    }
    return (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a, b), 0);
}

/* Thread ith's part of one job in mode m. */
static void work(team *t, int ith, int m) {
    if (m == MODE_RTT) {
        for (unsigned i = 0; i < ROUND_TRIPS; i++) {
            const unsigned mine = ith ? 2 * i + 2 : 2 * i + 1, wait = ith ? 2 * i + 1 : 2 * i + 2;
            if (ith) while (atomic_load_explicit(&t->v, memory_order_acquire) != wait) {}
            atomic_store_explicit(&t->v, mine, memory_order_release);
            if (!ith) while (atomic_load_explicit(&t->v, memory_order_acquire) != wait) {}
        }
        return;
    }
    if (m == MODE_CONTIGUOUS) {
        t->sink[ith] += read_range(t->buf + (size_t)ith * (PIECES * PIECE / 2), PIECES * PIECE / 2);
        return;
    }
    for (int k = 0; k < PIECES; k++) {
        t->sink[ith] += read_range(t->buf + (size_t)k * PIECE + (size_t)ith * (PIECE / 2), PIECE / 2);
        if (m == MODE_BARRIER) {
            atomic_store(&t->bar[ith], k + 1);
            while (atomic_load(&t->bar[1 - ith]) < k + 1) {}
        }
    }
}

static void *thread1(void *arg) {
    team *t = arg;
    pin(1);
    int seen = 0;
    for (;;) {
        int g;
        while ((g = atomic_load(&t->gen)) == seen) {}
        if (g < 0) return NULL;
        seen = g;
        work(t, 1, atomic_load(&t->mode));
        atomic_store(&t->done, g);
    }
}

/* Runs one job on both threads; returns its seconds. */
static double run(team *t, int m) {
    atomic_store(&t->v, 0);
    atomic_store(&t->bar[0], 0);
    atomic_store(&t->bar[1], 0);
    atomic_store(&t->mode, m);
    const int g = atomic_load(&t->gen) + 1;
    const double t0 = now();
    atomic_store(&t->gen, g);
    work(t, 0, m);
    while (atomic_load(&t->done) != g) {}
    return now() - t0;
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 150;
    const bool chop = argc > 2 && !strcmp(argv[2], "chop");
    if (rounds < 1 || rounds > 100000 || argc > 3 || (argc > 2 && !chop)) {
        fprintf(stderr, "usage: placement [ROUNDS=150, 1..100000] [chop]\n");
        return 2;
    }
    const size_t bytes = PIECES * PIECE;
    static team t;
    uint8_t *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        fprintf(stderr, "placement: cannot map %zu bytes\n", bytes);
        return 1;
    }
    madvise(buf, bytes, MADV_HUGEPAGE);
    memset(buf, 1, bytes);
    t.buf = buf;
    pin(0);
    pthread_t th;
    if (pthread_create(&th, NULL, thread1, &t)) {
        fprintf(stderr, "placement: cannot start the second thread\n");
        return 1;
    }
    double sum[2][MODE_COUNT] = {{0}};
    int n[2] = {0, 0};
    for (int r = 0; r < rounds; r++) {
        const double rt = run(&t, MODE_RTT) / ROUND_TRIPS * 1e9;
        double gb[MODE_COUNT];
        for (int m = MODE_BARRIER; m < MODE_COUNT; m++)
            gb[m] = chop || m == MODE_CONTIGUOUS ? (double)bytes / run(&t, m) / 1e9 : 0.0;
        const int far = rt > BENCH_RTT_FAR_NS;
        n[far]++;
        for (int m = MODE_BARRIER; m < MODE_COUNT; m++) sum[far][m] += gb[m];
        if (chop)
            printf("%3d round trip %4.0f ns  barrier %5.1f  no barrier %5.1f  contiguous %5.1f GB/s  %s\n", r, rt,
                   gb[MODE_BARRIER], gb[MODE_NO_BARRIER], gb[MODE_CONTIGUOUS], far ? "far" : "near");
        else
            printf("%3d round trip %4.0f ns  read %5.1f GB/s  %s\n", r, rt, gb[MODE_CONTIGUOUS], far ? "far" : "near");
        fflush(stdout);
        const struct timespec pause = {0, 50000000}; /* 50 ms between rounds */
        nanosleep(&pause, NULL);
    }
    for (int f = 0; f < 2; f++)
        if (n[f] && chop)
            printf("%s: %d rounds, barrier %.1f, no barrier %.1f, contiguous %.1f GB/s\n", f ? "far" : "near",
                   n[f], sum[f][MODE_BARRIER] / n[f], sum[f][MODE_NO_BARRIER] / n[f], sum[f][MODE_CONTIGUOUS] / n[f]);
        else if (n[f])
            printf("%s: %d rounds, mean read %.1f GB/s\n", f ? "far" : "near", n[f], sum[f][MODE_CONTIGUOUS] / n[f]);
    atomic_store(&t.gen, -1);
    pthread_join(th, NULL);
    return (int)((t.sink[0] ^ t.sink[1]) & 0);
}
