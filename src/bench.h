/* bench.h — `ditto bench`: prefill and decode throughput at several
 * concurrencies against the machine's measured read bandwidth. */
#ifndef DITTO_BENCH_H
#define DITTO_BENCH_H

#include <stddef.h>

/* argv[0] = "bench". Prints a markdown table; returns a process exit code. */
int bench_cmd(int argc, char **argv);

/* A read-bandwidth probe: a buffer of `bytes` (on huge pages where available, touched once)
 * and n_threads threads. bench_probe_run returns GB/s: wide vector loads over the buffer as
 * 1, 2, 4 and 8 interleaved streams per thread, each with no software prefetch, with prefetch
 * into L1 1 KiB ahead, and as the kernels do (cpu/prefetch.h: into L1 1 KiB and L2 8 KiB ahead): best of
 * `reps` each, and the best of all twelve patterns; by_pattern (may be NULL) gets each
 * pattern's best: index 3*log2(streams) + (0 none, 1 L1 1 KiB, 2 as the kernels).
 * NULL / 0 if out of memory. */
#define BENCH_PATTERNS 12
typedef struct bench_probe bench_probe;
bench_probe *bench_probe_create(int n_threads, size_t bytes);
double bench_probe_run(bench_probe *p, int reps, double by_pattern[BENCH_PATTERNS]);
/* GB/s of one load-only pass of `bytes` in all (the buffer read whole as often as they fill it,
 * then the rest), as the probe's first pattern: one sequential stream per thread, no software
 * prefetch. Sized as a decode step's reads, it is that step's length where each pattern of
 * bench_probe_run lasts one buffer's read. 0 if p is NULL. */
double bench_probe_stream(bench_probe *p, double bytes);
/* The round trip, in ns, of a cache line handed from thread 0 of the probe's pool to thread 1
 * and back: their cores' distance. 0 with one thread. */
double bench_probe_rtt(bench_probe *p);
/* The round trip above which the bench calls two threads "far" (on two core complexes): on this
 * project's VM the two vCPUs read 50-160 ns on one complex and 250-830 ns on two, where the
 * machine reads ~1.5x faster — its "fast phases" (bench/cpu-speed-log.md, thirty-fourth session). */
#define BENCH_RTT_FAR_NS 200
void bench_probe_free(bench_probe *p);

#endif
