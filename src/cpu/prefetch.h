/* prefetch.h — how far ahead the CPU kernels software-prefetch a weight stream, and into
 * which cache level.
 *
 * Into L1 (T0), 4 KiB ahead, in every kernel that streams weights. On the Zen 5 host this
 * project now runs on (2 vCPUs, 65-85 GB/s read by plain loads on both), the hardware
 * prefetchers alone left the one-token AVX-512 kernels reading ~21 GB/s a thread from memory
 * where they compute at ~104 GB/s in L1 and plain loads stream at ~33-39: a T0 prefetch 2-8 KiB
 * ahead read 1.2-2.1x in-process (bench/ab_kernel.sh, q4_k and q6_k, 1 and 2 threads, big and
 * expert-sized matrices), the 2- and 6-token kernels 1.2-1.8x; into L2 (T1) 32 KiB ahead, as the
 * multi-token kernels did before, read no more than no prefetch at all. The whole model: solo
 * decode 18.9 -> 28.5 tok/s, 6 streams 33.2 -> 46.4 (bench/cpu-speed.md, twelfth session).
 *
 * History: the host under the VM changes between sessions, and so did the answer. In the seventh
 * session (a host of the same kind, by the sessions that checked then, but in phases where plain
 * loads read 30-49 GB/s, and with the kernels of that time) 4 KiB ahead into L1 left the one-token
 * Q4_K kernel at 20 GB/s where plain loads read 32 — a T0 prefetch holds one of the core's L1 miss
 * buffers until its line arrives — so the kernels prefetched into L2 32 KiB ahead; on the Zen 4
 * host of the ninth to eleventh sessions the AVX-512 one-token kernels read best with no software
 * prefetch at all (1.04-1.21x, tenth session). A host whose latency grows may prefer those again. */
#ifndef DITTO_CPU_PREFETCH_H
#define DITTO_CPU_PREFETCH_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

/* Overridable at build time (bench/ab_kernel.sh compares forms in one process); CPU_PF_DIST 0
 * turns the kernels' weight-stream prefetch off. */
#ifndef CPU_PF_DIST
#define CPU_PF_DIST 4096 /* bytes ahead in the weight stream */
#endif
#ifndef CPU_PF_HINT
#define CPU_PF_HINT _MM_HINT_T0
#endif

/* What the calling thread reads right after a kernel call, in order: up to CPU_NEXT_MAX
 * regions (the next matrix of its run, or the inputs of the stage that follows). A kernel's
 * prefetch that runs past the end of its call's rows continues into them at the same lead, so
 * the stream does not go quiet for the call's last CPU_PF_DIST bytes. */
#define CPU_NEXT_MAX 4
typedef struct cpu_next {
    int n;
    const uint8_t *p[CPU_NEXT_MAX];
    size_t len[CPU_NEXT_MAX];
} cpu_next;

/* Prefetches the `bytes` that lie CPU_PF_DIST ahead of p: before `end` (the end of the
 * call's rows) from the call's own stream, beyond it from nx's regions (none if nx is NULL). */
static inline __attribute__((always_inline)) void cpu_prefetch_ahead(const uint8_t *p, size_t bytes,
                                                                     const uint8_t *end, const cpu_next *nx) {
    if (CPU_PF_DIST == 0) return;
    const uint8_t *q = p + CPU_PF_DIST;
    if (q + bytes <= end) {
        for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)q + o, CPU_PF_HINT);
        return;
    }
    if (!nx) return;
    for (size_t o = 0; o < bytes; o += 64) {
        if (q + o < end) {
            _mm_prefetch((const char *)q + o, CPU_PF_HINT);
            continue;
        }
        size_t t = (size_t)(q + o - end);
        for (int i = 0; i < nx->n; t -= nx->len[i], i++)
            if (t < nx->len[i]) {
                _mm_prefetch((const char *)nx->p[i] + t, CPU_PF_HINT);
                break;
            }
    }
}

/* Requests the lines of the block CPU_PF_AGAIN1 and CPU_PF_AGAIN2 bytes ahead of p into L2 again,
 * where they are still before `end` (no continuation past it). A line prefetched once 32 KiB ahead
 * is often not in L2 when the kernel reaches it (a T1 prefetch is a hint the core may drop; one
 * published measurement on Zen 4 found exactly that). With these two re-requests the one-token
 * kernels read 1.03-1.29x from memory (medians ~1.07, in-process A/B; whole model: paired solo
 * 80-85% -> 88-91% of the bound); a third one added 0-3% in ordinary phases and cost 13-27% in
 * fast ones (the first two gained there too: 1.06-1.28x); the 2- to 8-token kernels mostly read
 * less with them (T = 2: 0.87-1.09x, T = 3-8: 0.59-1.01x; compute, not the stream, sets their
 * pace), and in cache the one-token kernels run ~0.7x (weights of a decode step are never in
 * cache). So only the AVX2 one-token path uses it now (the AVX-512 one-token kernels dropped it
 * with all their software prefetch in the tenth session). bench/cpu-speed.md, ninth session. */
#define CPU_PF_AGAIN1 16384
#define CPU_PF_AGAIN2 8192
static inline __attribute__((always_inline)) void cpu_prefetch_again(const uint8_t *p, size_t bytes,
                                                                     const uint8_t *end) {
    static const size_t dist[2] = {CPU_PF_AGAIN1, CPU_PF_AGAIN2};
    for (int i = 0; i < 2; i++)
        if (p + dist[i] + bytes <= end)
            for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + dist[i] + o, CPU_PF_HINT);
}

#endif
