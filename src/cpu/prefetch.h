/* prefetch.h — how far ahead the CPU kernels software-prefetch a weight stream, and into
 * which cache level.
 *
 * Two requests per line: into L1 (T0) CPU_PF_DIST = 1 KiB ahead, and into L2 (T1) CPU_PF_FAR =
 * 8 KiB ahead, in every AVX-512 kernel that streams weights (the AVX2 ones one request into L2: see
 * repack_avx2.c). On the Intel host of the thirteenth and fourteenth sessions (Emerald Rapids,
 * 2 vCPUs, 21-31 GB/s on both) a T0 request holds one of the core's L1 miss buffers until its
 * line arrives from memory, and with T0 alone 4 KiB ahead those buffers were full most of the
 * time (perf: 76% of the one-token kernel's samples on the instruction after a prefetcht0); the
 * far T1 request brings the line into L2 first, so the near T0 one waits only for L2. In-process
 * (bench/ab_kernel.sh, 0.45 GiB, one token, two threads) the two requests in a burst per block
 * read 1.05-1.07x the T0-4 KiB form on Q4_K, and issued beside each line's load
 * (cpu_prefetch_line, repack_avx512.c) 1.11-1.14x; whole model, solo ~10.7 -> ~12.5 tok/s
 * (bench/cpu-speed-log.md, fourteenth session).
 *
 * History: the host under the VM changes between sessions, and so did the answer. On the Zen 5
 * host of the twelfth session T0 4 KiB ahead alone read 1.2-2.1x no software prefetch (the
 * hardware prefetchers alone left the one-token AVX-512 kernels at ~21 GB/s a thread), and a
 * second, far T1/T2 request beside it read 0.75-0.96x there. In the seventh session (a host of
 * the same kind, in phases where plain loads read 30-49 GB/s, and with the kernels of that
 * time) 4 KiB ahead into L1 left the one-token Q4_K kernel at 20 GB/s where plain loads read
 * 32, so the kernels prefetched into L2 32 KiB ahead; on the Zen 4 host of the ninth to
 * eleventh sessions the AVX-512 one-token kernels read best with no software prefetch at all
 * (1.04-1.21x, tenth session). A host whose latency grows may prefer those again. */
#ifndef DITTO_CPU_PREFETCH_H
#define DITTO_CPU_PREFETCH_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_quant.h"

/* Overridable at build time (bench/ab_kernel.sh compares forms in one process); CPU_PF_DIST 0
 * turns the near request off, CPU_PF_FAR 0 the far one. */
#ifndef CPU_PF_DIST
#define CPU_PF_DIST 1024 /* bytes ahead in the weight stream, near request */
#endif
#ifndef CPU_PF_HINT
#define CPU_PF_HINT _MM_HINT_T0
#endif
#ifndef CPU_PF_FAR
#define CPU_PF_FAR 8192 /* bytes ahead, far request */
#endif
#ifndef CPU_PF_FAR_HINT
#define CPU_PF_FAR_HINT _MM_HINT_T1
#endif
/* How far past a call's rows its requests reach: the length a continuation (cpu_next) needs. */
#define CPU_PF_SPAN (CPU_PF_FAR > CPU_PF_DIST ? CPU_PF_FAR : CPU_PF_DIST)

/* How the one-token (solo decode) kernels stream a matrix, chosen per host at run time
 * (cpu_stream_detect, cpu_quant.h); results are the same bits in every form, only the order of
 * memory requests differs. The multi-token kernels use CPU_STREAM_NEAR_FAR's requests in both.
 *   CPU_STREAM_NEAR_FAR: one stream per call, each line requested CPU_PF_DIST ahead into L1 and
 *     CPU_PF_FAR ahead into L2 (the Intel host of the thirteenth to seventeenth sessions).
 *   CPU_STREAM_TWO_L1: the call's groups in two halves read in lockstep, block by block (two
 *     streams per thread), each line requested CPU_PF2_DIST ahead into L1 only. On the Zen 5
 *     host of the eighteenth session it read 1.09-1.31x NEAR_FAR (one-token kernels, in-process
 *     medians; the whole solo step 1.02-1.30x); two streams with NEAR_FAR's requests, three or
 *     four streams, 2 or 8 KiB ahead, or a far request beside it read less (bench/cpu-speed-log.md,
 *     eighteenth session).
 *   CPU_STREAM_PLAIN: one stream per call and no software prefetch: the hardware prefetchers
 *     alone. On the Zen 4 host of the twenty-seventh session it read 1.10-1.18x NEAR_FAR
 *     (one-token Q4_K / Q6_K, in-process, two threads, from memory; TWO_L1 read 0.65-0.80x
 *     there), as no prefetch did in the tenth session on a host of that kind. The multi-token
 *     kernels keep their requests: without them they read ~0.5x.
 *   CPU_STREAM_TOUCH: plain, and the Q4_K / Q5_K kernels (one token; the multi-token ones at up to
 *     two tokens, beside their requests) first read each weight line of a block with a 256-bit
 *     load (cpu_touch_line) one line ahead of the 512-bit load that uses it, as the
 *     f32 router's one-token rows do (quant_avx512.c). On the Zen 4 host a 512-bit load that
 *     misses the caches streams slower than 256-bit ones (a read-only pass of 512-bit loads in the
 *     kernel's order 0.79 of plain 256-bit loads, 256-bit ones 0.97-1.0): the one-token Q4_K
 *     kernel, one thread from memory, 1.07-1.10x plain (0.96-0.99 of plain loads against
 *     0.87-0.91), two tokens ~1.07x, four and six ~0.98x (so not above two); whole solo steps in
 *     one process 1.049x at one thread, 1.01-1.05x far at two, 1.00x near (bench/cpu-speed-log.md,
 *     forty-first session). The AVX2 kernels' loads are 256-bit already: they run plain. */
/* CPU_PF2_DIST: two-l1's lead. 3.5 KiB, not 4: on the Zen 5 host the solo step read 1.036x, 1.013x and
 * 1.013x with 3584 against 4096 (3840: 1.019x; 3072: 1.008x and 0.982x; 2048 0.931x, 5120 0.967x, 6144
 * 0.978x, 8192 0.957x; a far request into L2 beside it, 16 or 32 KiB ahead, 0.78x and 0.74x), each a
 * `ditto bench --switch 300` run of a second build of this file against the engine's (A/A 0.998-1.003):
 * bench/cpu-speed-log.md, forty-eighth session. The kernel harness (bench/ab_kernel.sh) had found the
 * distances alike. Perhaps because a request exactly 4 KiB ahead maps to the L1 set of the line being
 * loaded (64 sets of 64 bytes); not measured. */
#ifndef CPU_PF2_DIST
#define CPU_PF2_DIST 3584
#endif
/* A form's near / far distances (bytes; 0 = no such request) and the longer of the two. */
#define CPU_FORM_DIST(f) ((f) == CPU_STREAM_TWO_L1 ? CPU_PF2_DIST : cpu_stream_no_requests(f) ? 0 : CPU_PF_DIST)
#ifndef CPU_PF2_FAR
#define CPU_PF2_FAR 0 /* two-l1's far request into L2: none */
#endif
#define CPU_FORM_FAR(f) ((f) == CPU_STREAM_TWO_L1 ? CPU_PF2_FAR : cpu_stream_no_requests(f) ? 0 : CPU_PF_FAR)
#define CPU_FORM_SPAN(f) (CPU_FORM_FAR(f) > CPU_FORM_DIST(f) ? CPU_FORM_FAR(f) : CPU_FORM_DIST(f))

/* CPU_STREAM_TOUCH's first read of a line: a 256-bit load of the 32 bytes at p into a register
 * nothing reads (ymm31: AVX-512 translation units only). */
static inline __attribute__((always_inline)) void cpu_touch_line(const void *p) {
    __asm__ volatile("vmovdqu64 %0, %%ymm31" : : "m"(*(const __m256i *)p) : "xmm31");
}

/* Both requests of form f for the line at p (a stream read front to back; no bound check: a
 * prefetch past the end of a mapping does not fault). f is a constant once inlined. */
static inline __attribute__((always_inline)) void cpu_prefetch_line_form(const char *p, const int f) {
    if (CPU_FORM_FAR(f)) _mm_prefetch(p + CPU_FORM_FAR(f), CPU_PF_FAR_HINT);
    if (CPU_FORM_DIST(f)) _mm_prefetch(p + CPU_FORM_DIST(f), CPU_PF_HINT);
}
static inline __attribute__((always_inline)) void cpu_prefetch_line(const char *p) {
    cpu_prefetch_line_form(p, CPU_STREAM_NEAR_FAR);
}

/* What the calling thread reads right after a kernel call, in order: up to CPU_NEXT_MAX
 * regions (the next matrix of its run, or the inputs of the stage that follows). A kernel's
 * prefetch that runs past the end of its call's rows continues into them at the same lead, so
 * the stream does not go quiet for the call's last CPU_PF_SPAN bytes. */
#define CPU_NEXT_MAX 4
typedef struct cpu_next {
    int n;
    const uint8_t *p[CPU_NEXT_MAX];
    size_t len[CPU_NEXT_MAX];
} cpu_next;

/* How much of the next gemm stage each thread requests while it waits in the pool (its own
 * segment's first bytes; cpu_backend.c, ahead_*), and into which level. */
#ifndef CPU_AHEAD_BYTES
#define CPU_AHEAD_BYTES (256 * 1024)
#endif
#ifndef CPU_AHEAD_HINT
#define CPU_AHEAD_HINT _MM_HINT_T1
#endif

/* _mm_prefetch with the hint as a value (a constant once inlined). */
static inline __attribute__((always_inline)) void cpu_pf(const void *p, int hint) {
    switch (hint) {
    case _MM_HINT_T0: _mm_prefetch(p, _MM_HINT_T0); break;
    case _MM_HINT_T1: _mm_prefetch(p, _MM_HINT_T1); break;
    case _MM_HINT_T2: _mm_prefetch(p, _MM_HINT_T2); break;
    default: _mm_prefetch(p, _MM_HINT_NTA); break;
    }
}

/* Prefetches the `bytes` that lie `dist` ahead of p with `hint`: before `end` (the end of the
 * call's rows) from the call's own stream, beyond it from nx's regions (none if nx is NULL). */
static inline __attribute__((always_inline)) void cpu_prefetch_tier(const uint8_t *p, size_t bytes, const uint8_t *end,
                                                                    const cpu_next *nx, size_t dist, int hint) {
    const uint8_t *q = p + dist;
    if (q + bytes <= end) {
        for (size_t o = 0; o < bytes; o += 64) cpu_pf(q + o, hint);
        return;
    }
    if (!nx) return;
    for (size_t o = 0; o < bytes; o += 64) {
        if (q + o < end) {
            cpu_pf(q + o, hint);
            continue;
        }
        size_t t = (size_t)(q + o - end);
        for (int i = 0; i < nx->n; t -= nx->len[i], i++)
            if (t < nx->len[i]) {
                cpu_pf(nx->p[i] + t, hint);
                break;
            }
    }
}

/* Both requests of form f for the `bytes` at p, the far one first (it has the longer wait ahead). */
static inline __attribute__((always_inline)) void cpu_prefetch_ahead_form(const uint8_t *p, size_t bytes,
                                                                          const uint8_t *end, const cpu_next *nx,
                                                                          const int f) {
    if (CPU_FORM_FAR(f)) cpu_prefetch_tier(p, bytes, end, nx, CPU_FORM_FAR(f), CPU_PF_FAR_HINT);
    if (CPU_FORM_DIST(f)) cpu_prefetch_tier(p, bytes, end, nx, CPU_FORM_DIST(f), CPU_PF_HINT);
}
static inline __attribute__((always_inline)) void cpu_prefetch_ahead(const uint8_t *p, size_t bytes,
                                                                     const uint8_t *end, const cpu_next *nx) {
    cpu_prefetch_ahead_form(p, bytes, end, nx, CPU_STREAM_NEAR_FAR);
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
 * cache). So only the AVX2 one-token path in its near-far form uses it now (the AVX-512 one-token kernels dropped it
 * with all their software prefetch in the tenth session). bench/cpu-speed-log.md, ninth session. */
#define CPU_PF_AGAIN1 16384
#define CPU_PF_AGAIN2 8192
static inline __attribute__((always_inline)) void cpu_prefetch_again(const uint8_t *p, size_t bytes,
                                                                     const uint8_t *end, int hint) {
    static const size_t dist[2] = {CPU_PF_AGAIN1, CPU_PF_AGAIN2};
    for (int i = 0; i < 2; i++)
        if (p + dist[i] + bytes <= end)
            for (size_t o = 0; o < bytes; o += 64) cpu_pf(p + dist[i] + o, hint);
}

#endif
