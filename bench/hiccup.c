/* hiccup.c — how often, and how much at once, the machine takes the CPUs away from a thread that
 * never waits: on a VM, the time a decode step's threads lose to the host and the guest kernel.
 *
 *   cc -std=c11 -O2 -Wall -Wextra -Werror -pthread -o build/hiccup bench/hiccup.c
 *   ./build/hiccup [SECONDS=5] [CPUS=2]
 *
 * One thread per CPU (pinned to CPUs 0..CPUS-1) reads the clock in a loop; a step between two
 * reads longer than 5 µs is a gap. Prints per CPU the gaps by length and the time they took, and
 * how much of that time some other CPU was in a gap too. Threads joined by barriers (the one-job
 * solo step) pay for a CPU's gap twice where the others were running meanwhile, and about once
 * where the whole machine stopped; bench/cpu-speed-log.md (forty-fifth session) has this VM's figures. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_CPUS 64
#define MAX_GAPS 400000
#define GAP_S 5e-6

static const double bucket_s[] = {20e-6, 50e-6, 100e-6, 500e-6, 2e-3}; /* upper ends; the last bucket is open */
#define N_BUCKETS (sizeof bucket_s / sizeof bucket_s[0] + 1)

typedef struct gaps {
    int cpu;
    double t_end;
    long n;
    double *start, *len; /* [MAX_GAPS] */
} gaps;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *watch(void *arg) {
    gaps *g = arg;
    cpu_set_t cs;
    CPU_ZERO(&cs);
    CPU_SET(g->cpu, &cs);
    if (pthread_setaffinity_np(pthread_self(), sizeof cs, &cs) != 0) fprintf(stderr, "hiccup: CPU %d: not pinned\n", g->cpu);
    double prev = now();
    for (;;) {
        const double t = now();
        if (t - prev > GAP_S && g->n < MAX_GAPS) g->start[g->n] = prev, g->len[g->n++] = t - prev;
        prev = t;
        if (t > g->t_end) return NULL;
    }
}

/* The first of c's gaps that ends after t (a CPU's gaps are in order and never overlap), or c->n. */
static long first_ending_after(const gaps *c, double t) {
    long lo = 0, hi = c->n;
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        if (c->start[mid] + c->len[mid] > t) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* Seconds of a's gap i during which some other CPU was in a gap too. */
static double shared_s(const gaps *all, int n_cpu, int a, long i) {
    const double s = all[a].start[i], e = s + all[a].len[i];
    double covered = 0.0, reach = s; /* [s, reach) accounted for */
    while (reach < e) {
        double from = e, to = e; /* the earliest-starting other gap that covers part of [reach, e) */
        for (int c = 0; c < n_cpu; c++) {
            if (c == a) continue;
            const long j = first_ending_after(&all[c], reach);
            if (j == all[c].n || all[c].start[j] >= e) continue;
            const double js = all[c].start[j] > reach ? all[c].start[j] : reach;
            if (js < from) from = js, to = all[c].start[j] + all[c].len[j];
        }
        if (from >= e) break;
        if (to > e) to = e;
        covered += to - from;
        reach = to;
    }
    return covered;
}

int main(int argc, char **argv) {
    const double seconds = argc > 1 ? atof(argv[1]) : 5.0;
    const int n_cpu = argc > 2 ? atoi(argv[2]) : 2;
    if (!(seconds > 0.0 && seconds <= 600.0) || n_cpu < 1 || n_cpu > MAX_CPUS) {
        fprintf(stderr, "usage: hiccup [SECONDS=5 (0-600]] [CPUS=2 (1-%d)]\n", MAX_CPUS);
        return 2;
    }
    gaps g[MAX_CPUS];
    pthread_t th[MAX_CPUS];
    const double t_end = now() + seconds;
    for (int c = 0; c < n_cpu; c++) {
        g[c] = (gaps){.cpu = c, .t_end = t_end, .start = malloc(sizeof(double) * MAX_GAPS), .len = malloc(sizeof(double) * MAX_GAPS)};
        if (!g[c].start || !g[c].len) {
            fprintf(stderr, "hiccup: out of memory\n");
            return 1;
        }
    }
    for (int c = 0; c < n_cpu; c++)
        if (pthread_create(&th[c], NULL, watch, &g[c]) != 0) {
            fprintf(stderr, "hiccup: cannot start thread %d\n", c);
            return 1;
        }
    for (int c = 0; c < n_cpu; c++) pthread_join(th[c], NULL);

    printf("hiccup: %d CPU%s, %.1f s; gaps of over %.0f µs between two clock reads, by length\n\n", n_cpu, n_cpu > 1 ? "s" : "", seconds, GAP_S * 1e6);
    printf("| CPU | gaps | <20 µs | <50 | <100 | <500 | <2 ms | longer | longest ms | time lost | of it, another CPU in a gap too |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int c = 0; c < n_cpu; c++) {
        long bucket[N_BUCKETS] = {0};
        double lost = 0.0, longest = 0.0, shared = 0.0;
        for (long i = 0; i < g[c].n; i++) {
            const double l = g[c].len[i];
            size_t b = 0;
            while (b < N_BUCKETS - 1 && l >= bucket_s[b]) b++;
            bucket[b]++;
            lost += l;
            if (l > longest) longest = l;
            if (n_cpu > 1) shared += shared_s(g, n_cpu, c, i);
        }
        printf("| %d | %ld |", c, g[c].n);
        for (size_t b = 0; b < N_BUCKETS; b++) printf(" %ld |", bucket[b]);
        printf(" %.2f | %.1f ms (%.2f%%) |", longest * 1e3, lost * 1e3, 100.0 * lost / seconds);
        if (n_cpu > 1) printf(" %.0f%% |\n", lost > 0.0 ? 100.0 * shared / lost : 0.0);
        else printf(" — |\n");
        if (g[c].n == MAX_GAPS) printf("(CPU %d: its first %d gaps only; any later ones not counted)\n", c, MAX_GAPS);
    }
    for (int c = 0; c < n_cpu; c++) free(g[c].start), free(g[c].len);
    return 0;
}
