/* bench.h — `ditto bench`: prefill and decode throughput at several
 * concurrencies against the machine's measured read bandwidth. */
#ifndef DITTO_BENCH_H
#define DITTO_BENCH_H

#include <stddef.h>

/* argv[0] = "bench". Prints a markdown table; returns a process exit code. */
int bench_cmd(int argc, char **argv);

/* Read bandwidth in GB/s: wide vector loads over `bytes` on n_threads threads, best of `reps`. */
double bench_read_bandwidth(int n_threads, size_t bytes, int reps);

#endif
