/* claim.h — a stage's work units [0, total) handed out over n threads: one contiguous
 * segment per thread, claimed from its front, half of what is left each time but at most an
 * eighth of the segment (CLAIM_RUNS, the default of claim_set.runs); a thread whose segment is
 * empty steals the back half of what is left in the fullest segment, under the same cap.
 *
 * Why this shape (bench/cpu-speed-log.md, fifth session): the threads' weight streams stay a
 * segment apart (this machine reads nearby streams slower), a thread slowed by the memory
 * system or descheduled by the host is relieved by the others, and no run is reserved
 * before it is needed, so a stage's threads end within about one small run of each other.
 * Any interleaving of claims hands out every unit exactly once. */
#ifndef DITTO_CPU_CLAIM_H
#define DITTO_CPU_CLAIM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* The most one run takes: 1 / CLAIM_RUNS of its segment (rounded up). A run is committed to the
 * thread that took it, so a half-segment run of units that cost more than most (an expert with
 * many tokens) left the other threads idle at a stage's end: on 16 threads the expert stages of
 * a prefill spent a third of their time between the first thread done and the last. */
#define CLAIM_RUNS 8
/* The cap of a one-row step's runs on hosts whose one-token kernels stream in the two-l1 form
 * (cpu/prefetch.h; the Zen 5 host): runs of up to half a segment, fewer and longer kernel calls.
 * There the solo step read 1.011-1.016x against eighths (ditto bench --switch --claim-runs-ab 2,
 * four runs of 200-300 pairs; quarters 1.008x, whole segments 1.004x): bench/cpu-speed-log.md,
 * forty-eighth session. Batches and prefill keep CLAIM_RUNS (their units cost unevenly). */
#define CLAIM_RUNS_TWO_L1_SOLO 2
#define CLAIM_RUNS_MAX 1024 /* the largest claim_set.runs an option may set (engine option cpu_claim_runs) */

/* One segment: its unclaimed [front, back) packed as front | back << 32 (one CAS claims
 * from either end), its initial back and its run cap; a cache line each. */
typedef struct claim_seg {
    _Atomic uint64_t fb;
    int end;
    _Atomic int cap; /* read by stealers while the owner may set the next stage's (any value is safe) */
    char pad[64 - sizeof(uint64_t) - 2 * sizeof(int)];
} claim_seg;
_Static_assert(sizeof(claim_seg) == 64, "claim_seg: one cache line");

typedef struct claim_set {
    claim_seg *seg; /* [n] */
    int n;
    int runs; /* a run takes at most 1 / runs of its segment (1..CLAIM_RUNS_MAX): CLAIM_RUNS unless set before a reset */
} claim_set;

/* n >= 1 threads; claim_free releases. */
void claim_init(claim_set *c, int n);
void claim_free(claim_set *c);

/* Cuts [0, total) into n equal segments (before the threads start; not concurrent):
 * thread i's is [claim_cut(total, n, i), claim_cut(total, n, i + 1)). */
void claim_reset(claim_set *c, int total);
static inline int claim_cut(int total, int n, int i) { return (int)((long long)total * i / n); }

/* Thread ith's own segment of [0, total) set up by thread ith itself, for stages that follow one
 * another inside one job with a barrier between them (no thread claims in stage s + 1 before
 * every thread's claim_next returned false in stage s): when a stage starts every segment is
 * empty, so another thread that looks at segment ith before this call finds nothing to steal,
 * and after it finds only this stage's units. Every thread must call it with the same total. */
void claim_reset_own(claim_set *c, int total, int ith);

/* Thread ith's next run [*u0, *u1), non-empty: from its own segment's front (*own = true;
 * own runs are consecutive, ascending), else stolen from another's back. False when every
 * unit is claimed. Safe to call from all threads at once. */
bool claim_next(claim_set *c, int ith, int *u0, int *u1, bool *own);

/* The initial back of thread ith's segment: after an own run ending at e < it, the next own
 * run (if not stolen meanwhile) starts at e. */
static inline int claim_seg_end(const claim_set *c, int ith) { return c->seg[ith].end; }

#endif
