/* prefetch.h — how far ahead the CPU kernels software-prefetch a weight stream, and into
 * which cache level.
 *
 * Into L2 (T1), 32 KiB ahead: on this project's development VM the memory latency under a
 * two-thread stream reaches about a microsecond in its slow phases, and a prefetch into L1 holds
 * one of the core's few L1 miss buffers for all that time; 4 KiB ahead into L1 then left the
 * kernels waiting on their own loads (the one-token Q4_K kernel read 20 GB/s where plain loads
 * read 32). Into L2 from 32 KiB ahead it read the same as plain loads (bench/cpu-speed.md,
 * seventh session). L2 is 1 MiB or more on every x86 core with AVX-512, so the lead fits. */
#ifndef DITTO_CPU_PREFETCH_H
#define DITTO_CPU_PREFETCH_H

#include <immintrin.h>

#define CPU_PF_DIST 32768      /* bytes ahead in the weight stream */
#define CPU_PF_HINT _MM_HINT_T1

#endif
