/* placement.c — how far apart the two vCPUs sit, beside what the machine reads, over time.
 *
 *   bench/placement.sh [ROUNDS=150]
 *
 * Each round: thread 0 (CPU 0) and thread 1 (CPU 1) hand a counter back and forth through one
 * cache line 20000 times (the round trip, ns), then both read their half of a 512 MiB buffer
 * (huge pages where given) with 256-bit loads, one stream each, best of three (GB/s); then a
 * 50 ms pause. Prints one line per round and, at the end, the rounds split at a round trip of
 * 200 ns (BENCH_RTT_FAR_NS in src/bench.h) with the mean read rate of each side. On this
 * project's VM the two vCPUs sit either on one core complex (round trip ~50-160 ns) or on two
 * (~250-830 ns), and the machine reads ~1.5x faster in the second placement: the "fast
 * phases" of bench/cpu-speed.md (thirty-fourth session). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define BYTES ((size_t)512 << 20)
#define ROUND_TRIPS 20000
#define FAR_NS 200.0

typedef struct shared {
    _Alignas(64) _Atomic unsigned v;   /* the ping-pong counter */
    _Alignas(64) _Atomic int phase;    /* 0 idle, 1 ping-pong, 2 read, -1 quit */
    _Alignas(64) _Atomic int read_go;  /* 1: thread 1 reads its half; 2: done */
    const uint8_t *buf;
    uint64_t sink;
} shared;

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

__attribute__((target("avx2"))) static uint64_t read_half(const uint8_t *p) {
    __m256i a = _mm256_setzero_si256(), b = a;
    for (size_t o = 0; o < BYTES / 2; o += 64) {
        a = _mm256_xor_si256(a, _mm256_load_si256((const __m256i *)(const void *)(p + o)));
        b = _mm256_xor_si256(b, _mm256_load_si256((const __m256i *)(const void *)(p + o + 32)));
    }
    return (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a, b), 0);
}

static void *thread1(void *arg) {
    shared *s = arg;
    pin(1);
    for (;;) {
        const int ph = atomic_load(&s->phase);
        if (ph < 0) return NULL;
        if (ph == 1) {
            for (unsigned i = 0; i < ROUND_TRIPS; i++) {
                while (atomic_load_explicit(&s->v, memory_order_acquire) != 2 * i + 1) {}
                atomic_store_explicit(&s->v, 2 * i + 2, memory_order_release);
            }
            while (atomic_load(&s->phase) == 1) {}
        } else if (ph == 2 && atomic_load(&s->read_go) == 1) {
            s->sink += read_half(s->buf + BYTES / 2);
            atomic_store(&s->read_go, 2);
        }
    }
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 150;
    static shared s;
    uint8_t *buf = mmap(NULL, BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED || rounds < 1) return 1;
    madvise(buf, BYTES, MADV_HUGEPAGE);
    memset(buf, 1, BYTES);
    s.buf = buf;
    pin(0);
    pthread_t t;
    if (pthread_create(&t, NULL, thread1, &s)) return 1;
    int n[2] = {0, 0};
    double bw_sum[2] = {0, 0}, rt_sum[2] = {0, 0};
    for (int r = 0; r < rounds; r++) {
        atomic_store(&s.v, 0);
        atomic_store(&s.phase, 1);
        double t0 = now();
        for (unsigned i = 0; i < ROUND_TRIPS; i++) {
            atomic_store_explicit(&s.v, 2 * i + 1, memory_order_release);
            while (atomic_load_explicit(&s.v, memory_order_acquire) != 2 * i + 2) {}
        }
        const double rt = (now() - t0) / ROUND_TRIPS * 1e9;
        atomic_store(&s.phase, 2);
        double bw = 0;
        for (int k = 0; k < 3; k++) {
            t0 = now();
            atomic_store(&s.read_go, 1);
            s.sink += read_half(buf);
            while (atomic_load(&s.read_go) != 2) {}
            const double gb = (double)BYTES / (now() - t0) / 1e9;
            bw = gb > bw ? gb : bw;
        }
        atomic_store(&s.read_go, 0);
        atomic_store(&s.phase, 0);
        const int far = rt > FAR_NS;
        n[far]++, bw_sum[far] += bw, rt_sum[far] += rt;
        printf("%3d round trip %4.0f ns  read %5.1f GB/s  %s\n", r, rt, bw, far ? "far" : "near");
        fflush(stdout);
        const struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&s.phase, -1);
    pthread_join(t, NULL);
    for (int f = 0; f < 2; f++)
        if (n[f])
            printf("%s: %d rounds, mean round trip %.0f ns, mean read %.1f GB/s\n", f ? "far (> 200 ns)" : "near",
                   n[f], rt_sum[f] / n[f], bw_sum[f] / n[f]);
    return (int)(s.sink & 0);
}
