/* bench.h — `ditto bench`: prefill and decode throughput at several
 * concurrencies against the machine's measured read bandwidth. */
#ifndef DITTO_BENCH_H
#define DITTO_BENCH_H

#include <stddef.h>

/* argv[0] = "bench". Prints a markdown table; returns a process exit code. */
int bench_cmd(int argc, char **argv);

/* A read-bandwidth probe: a buffer of `bytes` (on huge pages where available, touched once)
 * and n_threads threads. bench_probe_run returns GB/s: wide vector loads over the buffer as
 * 1, 2, 4 and 8 interleaved streams per thread, each with software prefetch into L1 1 KiB ahead
 * and as the kernels do (cpu/prefetch.h: into L2, 32 KiB ahead), best of `reps` each, and the best of all eight;
 * by_streams / by_prefetch (may be NULL) get the best per stream count / per prefetch.
 * NULL / 0 if out of memory. */
typedef struct bench_probe bench_probe;
bench_probe *bench_probe_create(int n_threads, size_t bytes);
double bench_probe_run(bench_probe *p, int reps, double by_streams[4], double by_prefetch[2]);
void bench_probe_free(bench_probe *p);

#endif
