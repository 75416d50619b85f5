/* kv.c — arena build, size formula and slot bookkeeping. */
#include "kv.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

size_t kv_key_bytes(const kv_key *k) {
    return (size_t)k->max_streams * (size_t)k->ctx * (size_t)k->n_layer * (size_t)k->n_head_kv *
           (size_t)k->head_dim * 2 * sizeof(fp16_t);
}

bool kv_key_equal(const kv_key *a, const kv_key *b) {
    return a->model_id == b->model_id && a->max_streams == b->max_streams && a->ctx == b->ctx &&
           a->n_layer == b->n_layer && a->n_head_kv == b->n_head_kv && a->head_dim == b->head_dim;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int kv_arena_create(kv_arena **out, const kv_key *key, ditto_err *err) {
    *out = NULL;
    if (key->ctx % KV_POS_GROUP)
        return err_set(err, "kv arena: ctx %d is not a multiple of %d", key->ctx, KV_POS_GROUP);
    if (key->max_streams < 1 || key->ctx < 1 || key->n_layer < 1 || key->n_head_kv < 1 || key->head_dim < 1)
        return err_set(err, "kv arena: invalid key (streams %d, ctx %d)", key->max_streams, key->ctx);
    size_t bytes = kv_key_bytes(key);
    /* Anonymous, on huge pages where the kernel gives them, and faulted in now: the decode
     * loop then never takes a page fault (one per new 4 KiB of KV otherwise, each costing
     * tens of microseconds in a VM), and a machine without the memory fails here, at boot. */
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return err_set(err, "kv arena: cannot allocate %zu bytes (%.2f GiB) for %d streams x %d ctx", bytes,
                       (double)bytes / (1u << 30), key->max_streams, key->ctx);
    madvise(mem, bytes, MADV_HUGEPAGE);
    if (madvise(mem, bytes, MADV_POPULATE_WRITE) != 0 && errno == ENOMEM) {
        munmap(mem, bytes);
        return err_set(err, "kv arena: cannot back %zu bytes (%.2f GiB) for %d streams x %d ctx with memory", bytes,
                       (double)bytes / (1u << 30), key->max_streams, key->ctx);
    }
    kv_arena *a = xcalloc(1, sizeof *a);
    a->key = *key;
    a->mem = mem;
    a->bytes = bytes;
    a->generation = 1;
    a->len = xcalloc((size_t)key->max_streams, sizeof(int));
    a->used = xcalloc((size_t)key->max_streams, sizeof(bool));
    *out = a;
    return 0;
}

int kv_arena_ensure(kv_arena **a, const kv_key *key, ditto_err *err) {
    if (*a && kv_key_equal(&(*a)->key, key)) return 0;
    uint64_t gen = *a ? (*a)->generation : 0;
    kv_arena *n;
    if (kv_arena_create(&n, key, err)) return -1;
    kv_arena_free(*a);
    n->generation = gen + 1;
    *a = n;
    return 0;
}

void kv_arena_free(kv_arena *a) {
    if (!a) return;
    munmap(a->mem, a->bytes);
    free(a->len);
    free(a->used);
    free(a);
}

void kv_arena_describe(const kv_arena *a, char *buf, size_t n) {
    const kv_key *k = &a->key;
    double gib = (double)a->bytes / (double)(1ull << 30);
    snprintf(buf, n, "kv arena: %d slots x %d ctx x %d layers x %d kv-heads x %d x 2 x f16 = %zu bytes (%.*f %s)",
             k->max_streams, k->ctx, k->n_layer, k->n_head_kv, k->head_dim, a->bytes, gib >= 1 ? 2 : 1,
             gib >= 1 ? gib : (double)a->bytes / (1 << 20), gib >= 1 ? "GiB" : "MiB");
}

int kv_slot_acquire(kv_arena *a) {
    for (int s = 0; s < a->key.max_streams; s++)
        if (!a->used[s]) {
            a->used[s] = true;
            a->len[s] = 0;
            a->n_used++;
            return s;
        }
    return -1;
}

void kv_slot_release(kv_arena *a, int slot) {
    DT_ASSERT(slot >= 0 && slot < a->key.max_streams && a->used[slot]);
    a->used[slot] = false;
    a->len[slot] = 0;
    a->n_used--;
}
