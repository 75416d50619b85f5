/* claim.c — segmented work claiming with stealing (contract in claim.h). */
#include "cpu/claim.h"

#include <stdlib.h>

#include "common.h"

static int claim_cap(const claim_set *c, int seg_units) {
    DT_ASSERT(c->runs >= 1);
    return DT_MAX(1, (seg_units + c->runs - 1) / c->runs);
}

void claim_init(claim_set *c, int n) {
    DT_ASSERT(n >= 1);
    c->seg = aligned_alloc(64, sizeof(claim_seg) * (size_t)n);
    DT_ASSERT(c->seg);
    c->n = n;
    c->runs = CLAIM_RUNS;
    claim_reset(c, 0);
}

void claim_free(claim_set *c) {
    free(c->seg);
    c->seg = NULL;
    c->n = 0;
}

void claim_reset(claim_set *c, int total) {
    DT_ASSERT(total >= 0);
    for (int i = 0; i < c->n; i++) {
        const int f = claim_cut(total, c->n, i), b = claim_cut(total, c->n, i + 1);
        c->seg[i].end = b;
        atomic_store_explicit(&c->seg[i].cap, claim_cap(c, b - f), memory_order_relaxed);
        atomic_store_explicit(&c->seg[i].fb, (uint64_t)(uint32_t)f | (uint64_t)(uint32_t)b << 32, memory_order_relaxed);
    }
}

void claim_reset_own(claim_set *c, int total, int ith) {
    DT_ASSERT(total >= 0 && ith >= 0 && ith < c->n);
    const int f = claim_cut(total, c->n, ith), b = claim_cut(total, c->n, ith + 1);
    c->seg[ith].end = b;
    atomic_store_explicit(&c->seg[ith].cap, claim_cap(c, b - f), memory_order_relaxed);
    atomic_store_explicit(&c->seg[ith].fb, (uint64_t)(uint32_t)f | (uint64_t)(uint32_t)b << 32, memory_order_relaxed);
}

/* Takes half of what is left of sg (at least one unit, at most its cap) from its front or,
 * stealing, its back. False when it is empty. */
static bool seg_take(claim_seg *sg, bool back, int *u0, int *u1) {
    const int cap = atomic_load_explicit(&sg->cap, memory_order_relaxed);
    uint64_t v = atomic_load_explicit(&sg->fb, memory_order_relaxed), nv;
    int f, b, take;
    do {
        f = (int)(uint32_t)v, b = (int)(uint32_t)(v >> 32);
        if (f >= b) return false;
        take = DT_MIN(cap, DT_MAX(1, (b - f) / 2));
        nv = back ? (uint64_t)(uint32_t)f | (uint64_t)(uint32_t)(b - take) << 32
                  : (uint64_t)(uint32_t)(f + take) | (uint64_t)(uint32_t)b << 32;
    } while (!atomic_compare_exchange_weak_explicit(&sg->fb, &v, nv, memory_order_relaxed, memory_order_relaxed));
    *u0 = back ? b - take : f, *u1 = back ? b : f + take;
    return true;
}

bool claim_next(claim_set *c, int ith, int *u0, int *u1, bool *own) {
    DT_ASSERT(ith >= 0 && ith < c->n);
    if ((*own = seg_take(&c->seg[ith], false, u0, u1))) return true;
    for (;;) {
        int best = -1, most = 0;
        for (int i = 0; i < c->n; i++) {
            uint64_t v = atomic_load_explicit(&c->seg[i].fb, memory_order_relaxed);
            int left = (int)(uint32_t)(v >> 32) - (int)(uint32_t)v;
            if (left > most) best = i, most = left;
        }
        if (best < 0) return false;
        if (seg_take(&c->seg[best], true, u0, u1)) return true;
    }
}
