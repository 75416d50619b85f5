/* prefetch.h — how far ahead the CPU kernels software-prefetch a weight stream, and into
 * which cache level.
 *
 * Into L2 (T1), 32 KiB ahead. On this project's development VM, 4 KiB ahead into L1 left
 * the one-token Q4_K kernel reading 20 GB/s from memory where plain loads read 32: a T0
 * prefetch holds one of the core's few L1 miss buffers until its line arrives, and in the
 * VM's slow phases that took long enough to stall the stream. Into L2 the kernel read 29-32;
 * 24-64 KiB ahead was one plateau, 12 KiB fell off (about a microsecond of lead at the
 * ~16 GB/s a thread streams). bench/cpu-speed.md, seventh session. 32 KiB per thread is a
 * small part of any x86 core's L2 (256 KiB or more). */
#ifndef DITTO_CPU_PREFETCH_H
#define DITTO_CPU_PREFETCH_H

#include <immintrin.h>

#define CPU_PF_DIST 32768      /* bytes ahead in the weight stream */
#define CPU_PF_HINT _MM_HINT_T1

#endif
