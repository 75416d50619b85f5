/* prepared.c — repacking of a model's quantized matrices at engine start. */
#include "cpu/prepared.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu/repack.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

#define PREP_CAP 4096 /* hash slots (power of two) */

struct cpu_prepared {
    prep_weight *items;
    int n;
    int *slot;        /* [PREP_CAP] index into items, -1 empty */
    uint8_t *mem;     /* every repacked matrix, in one 2 MiB-aligned anonymous range */
    void *map;        /* the mapping holding mem */
    size_t map_bytes;
    size_t bytes;
};

static size_t hash_ptr(const void *p) { return ((uintptr_t)p >> 3) * 0x9E3779B97F4A7C15ull >> 52 & (PREP_CAP - 1); }

const prep_weight *cpu_prepared_find(const cpu_prepared *cp, const model_weight *w) {
    if (!cp || !cp->n) return NULL;
    for (size_t h = hash_ptr(w);; h = (h + 1) & (PREP_CAP - 1)) {
        int i = cp->slot[h];
        if (i < 0) return NULL;
        if (cp->items[i].w == w) return &cp->items[i];
    }
}

size_t cpu_prepared_bytes(const cpu_prepared *cp) { return cp ? cp->bytes : 0; }

size_t cpu_prepared_huge_bytes(const cpu_prepared *cp) {
    if (!cp || !cp->map) return 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    /* the mapping's areas (madvise splits it) are the headers "lo-hi perms ..." inside it */
    const uintptr_t lo = (uintptr_t)cp->map, hi = lo + cp->map_bytes;
    char line[4096]; /* a header line ends in a path (PATH_MAX) */
    bool in = false;
    size_t total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        size_t kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            in = a >= lo && b <= hi;
        else if (in && sscanf(line, "AnonHugePages: %zu kB", &kb) == 1)
            total += kb << 10;
    }
    fclose(f);
    return total;
}

static void prepared_free(void *p) {
    cpu_prepared *cp = p;
    if (!cp) return;
    if (cp->map) munmap(cp->map, cp->map_bytes);
    free(cp->items);
    free(cp->slot);
    free(cp);
}

/* 16-row groups of one of w's matrices, and of all of them (the repack's unit of work). */
static long mat_groups(const model_weight *w) { return (long)((w->rows + REPACK_ROWS - 1) / REPACK_ROWS); }
static long item_groups(const model_weight *w) { return mat_groups(w) * w->n_mat; }

/* The pages of w's bytes in the file mapping: all that touch them (outward) or only those
 * wholly inside (inward). */
static void file_pages(const model_weight *w, uintptr_t pg, bool outward, uintptr_t *a, uintptr_t *b) {
    uintptr_t lo = (uintptr_t)w->data, hi = lo + w->mat_bytes * (size_t)w->n_mat;
    *a = outward ? lo & ~(pg - 1) : (lo + pg - 1) & ~(pg - 1);
    *b = outward ? (hi + pg - 1) & ~(pg - 1) : hi & ~(pg - 1);
}

typedef struct rp_task {
    cpu_prepared *cp;
    long total_groups;
    long lo, hi; /* groups of this pass */
} rp_task;

/* Groups [lo, hi) of the concatenation of all matrices of all items, split evenly over threads. */
static void repack_task(void *ctx, int ith, int nth) {
    rp_task *t = ctx;
    long span = t->hi - t->lo, lo = t->lo + span * ith / nth, hi = t->lo + span * (ith + 1) / nth, base = 0;
    for (int i = 0; i < t->cp->n && base < hi; i++) {
        const prep_weight *pw = &t->cp->items[i];
        const model_weight *w = pw->w;
        long gpm = mat_groups(w);
        for (int e = 0; e < w->n_mat; e++, base += gpm) {
            long a = DT_MAX(lo, base), b = DT_MIN(hi, base + gpm);
            if (a >= b) continue;
            const uint8_t *src = (const uint8_t *)w->data + (size_t)e * w->mat_bytes;
            uint8_t *dst = (uint8_t *)pw->data + (size_t)e * pw->mat_stride;
            if (pw->repacked) {
                repack_rows(w->type, src, w->row_bytes, w->rows, w->cols, dst, (int)(a - base), (int)(b - base));
            } else { /* groups of 16 rows, as the repack counts them */
                size_t r0 = (size_t)(a - base) * REPACK_ROWS, r1 = DT_MIN((size_t)(b - base) * REPACK_ROWS, (size_t)w->rows);
                memcpy(dst + r0 * w->row_bytes, src + r0 * w->row_bytes, (r1 - r0) * w->row_bytes);
            }
        }
    }
}

/* Records w's prepared form at offset off of the range (a pointer once the range exists). */
static void put(cpu_prepared *cp, const model_weight *w, bool copy, size_t off, size_t stride) {
    prep_weight *pw = &cp->items[cp->n];
    pw->w = w;
    pw->repacked = !copy;
    pw->mat_bytes = copy ? w->mat_bytes : repack_bytes(w->type, w->rows, w->cols);
    pw->mat_stride = stride ? stride : pw->mat_bytes;
    pw->group_bytes = copy ? w->row_bytes : repack_group_bytes(w->type, w->cols);
    pw->data = (const uint8_t *)(uintptr_t)off; /* offset until the mapping exists */
    size_t h = hash_ptr(w);
    while (cp->slot[h] >= 0) h = (h + 1) & (PREP_CAP - 1);
    cp->slot[h] = cp->n++;
}

/* Repacks w (a repack_supported type), or with copy set copies a float matrix as it is. */
static void add(cpu_prepared *cp, const model_weight *w, bool copy) {
    if (!w->data || cpu_prepared_find(cp, w)) return;
    if (copy ? !quant_type_is_float(w->type) : !repack_supported(w->type)) return;
    put(cp, w, copy, cp->bytes, 0);
    const prep_weight *pw = &cp->items[cp->n - 1];
    cp->bytes += (pw->mat_bytes * (size_t)w->n_mat + 63) & ~(size_t)63;
}

/* Repacks gate and up with matrix e of up right after matrix e of gate, where both are
 * repackable and alike (type, shape, count); else each on its own. */
static void add_pair(cpu_prepared *cp, const model_weight *g, const model_weight *u) {
    if (!g->data || !u->data || g->type != u->type || g->rows != u->rows || g->cols != u->cols ||
        g->n_mat != u->n_mat || !repack_supported(g->type) || cpu_prepared_find(cp, g) || cpu_prepared_find(cp, u)) {
        add(cp, g, false);
        add(cp, u, false);
        return;
    }
    const size_t m = repack_bytes(g->type, g->rows, g->cols);
    DT_ASSERT(m % 64 == 0);
    put(cp, g, false, cp->bytes, 2 * m);
    put(cp, u, false, cp->bytes + m, 2 * m);
    cp->bytes += 2 * m * (size_t)g->n_mat;
}

const cpu_prepared *cpu_prepared_get(model *m, pool *p) {
    if (m->prepared) return m->prepared;
    cpu_prepared *cp = xcalloc(1, sizeof *cp);
    m->prepared = cp;
    m->prepared_free = prepared_free;
    const char *env = getenv("DITTO_REPACK");
    if (env && !strcmp(env, "0")) return cp;
    int max_items = 1 + m->hp.n_layer * 11; /* output + per layer the 10 candidates below and the router */
    if (max_items >= PREP_CAP / 2) return cp; /* a model this deep runs on the file layout */
    cp->items = xcalloc((size_t)max_items, sizeof(prep_weight));
    cp->slot = xmalloc(sizeof(int) * PREP_CAP);
    for (int i = 0; i < PREP_CAP; i++) cp->slot[i] = -1;
    add(cp, &m->output, false);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        const model_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) add(cp, ws[i], false);
        add_pair(cp, &L->gate_exps, &L->up_exps);
        add(cp, &L->down_exps, false);
        add_pair(cp, &L->ffn_gate, &L->ffn_up);
        add(cp, &L->ffn_down, false);
        add(cp, &L->gate_inp, true); /* the router: read whole every step */
    }
    if (!cp->bytes) return cp;
    /* 2 MiB-aligned, so that every byte can sit on a huge page */
    size_t huge = (size_t)2 << 20;
    void *mem = mmap(NULL, cp->bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) { /* not fatal: the original layout works, only slower */
        fprintf(stderr, "ditto: cannot allocate %zu bytes for repacked weights; using the file layout\n", cp->bytes);
        cp->n = 0;
        cp->bytes = 0;
        return cp;
    }
    cp->map = mem;
    cp->map_bytes = cp->bytes + huge;
    cp->mem = (uint8_t *)(((uintptr_t)mem + huge - 1) & ~(uintptr_t)(huge - 1));
    /* transparent huge pages where the kernel allows: 512x fewer faults while repacking, fewer TLB misses after */
    madvise(cp->mem, cp->bytes, MADV_HUGEPAGE);
    long groups = 0;
    for (int i = 0; i < cp->n; i++) {
        prep_weight *pw = &cp->items[i];
        pw->data = cp->mem + (size_t)(uintptr_t)pw->data;
        groups += item_groups(pw->w);
    }
    /* In slices, so a terminal sees progress. After each slice the file pages of the
     * matrices it finished are dropped (MADV_PAGEOUT also evicts them from the page cache;
     * they are not read again, and a model of this size cannot keep its file cached beside
     * its repacked copy anyway): the memory they free is what lets the next slice's
     * destination get huge pages instead of fragments (the embedding is read from its own
     * copy, model_load's). */
    const long slices = 50;
    uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a, b;
    long gend = 0, gbeg = 0;
    int released = 0, populated = 0;
    for (long sl = 0; sl < slices; sl++) {
        rp_task t = {cp, groups, groups * sl / slices, groups * (sl + 1) / slices};
        /* read this slice's sources in bulk (a no-op where the model load already did) */
        for (long g = gbeg; populated < cp->n && g < t.hi; populated++) {
            const model_weight *w = cp->items[populated].w;
            g += item_groups(w);
            file_pages(w, pg, true, &a, &b);
            madvise((void *)a, b - a, MADV_POPULATE_READ);
            gbeg = g;
        }
        pool_run(p, repack_task, &t);
        for (; released < cp->n; released++) {
            const model_weight *w = cp->items[released].w;
            long g = gend + item_groups(w);
            if (g > t.hi) break;
            gend = g;
            file_pages(w, pg, false, &a, &b);
            if (b > a && madvise((void *)a, b - a, MADV_PAGEOUT) != 0) madvise((void *)a, b - a, MADV_DONTNEED);
        }
        progress_show("repacking weights", (uint64_t)sl + 1, (uint64_t)slices);
    }
    /* Where memory was too fragmented for a huge page at first touch (the file's page cache
     * fills most of it during the repack), collapse now: the weights are streamed every
     * step, and 4 KiB pages cost a page walk per 4 KiB and stop the hardware prefetcher. */
#ifdef MADV_COLLAPSE
    const size_t piece = (size_t)256 << 20;
    for (size_t o = 0; o < cp->bytes; o += piece) {
        size_t len = DT_MIN(piece, (cp->bytes - o) & ~(huge - 1));
        if (len) madvise(cp->mem + o, len, MADV_COLLAPSE); /* best effort */
        progress_show("huge pages", (uint64_t)(o / piece) + 1, (uint64_t)((cp->bytes + piece - 1) / piece));
    }
#endif
    return cp;
}
