/* kv.h — the KV arena: one allocation for max_streams slots, built once per key.
 *
 * Layout (fp16, round to nearest even), per (slot, layer, kv_head) a region of
 * ctx x head_dim halves for K and one for V:
 *   arena[slot][layer][K=0|V=1][kv_head][...]
 *   K: [ctx/16][head_dim][16]  — 16 consecutive positions interleaved per dimension, so
 *      attention scores vectorise across positions (lane = position) with plain loads
 *   V: [ctx][head_dim]         — one row per position (lane = dimension)
 * ctx is a multiple of KV_POS_GROUP (the engine rounds the cap up).
 * bytes = slots x ctx x layers x kv_heads x head_dim x 2 (K and V) x 2 (f16).
 * A slot's positions [0, len) are valid; bytes past len are never read, so a
 * release is a logical reset (len = 0) and nothing is ever wiped or moved. */
#ifndef DITTO_KV_H
#define DITTO_KV_H

#include <stdbool.h>
#include <stdint.h>

#include "common.h"
#include "quant.h"

/* The arena's identity: only a different key builds a new arena. */
typedef struct kv_key {
    const void *model_id; /* the model session the arena belongs to */
    int max_streams;
    int ctx;
    int n_layer, n_head_kv, head_dim;
} kv_key;

typedef struct kv_arena {
    kv_key key;
    fp16_t *mem;          /* mmap'ed, bytes long */
    size_t bytes;
    uint64_t generation;  /* counts builds of this arena object; never bumped by slot use */
    int *len;             /* [max_streams] valid positions per slot */
    bool *used;           /* [max_streams] slot owned by a stream */
    int n_used;
} kv_arena;

size_t kv_key_bytes(const kv_key *k);
bool kv_key_equal(const kv_key *a, const kv_key *b);
/* Builds an arena for key, or returns -1 with err (allocation failure names the size). */
int kv_arena_create(kv_arena **out, const kv_key *key, ditto_err *err);
/* Keeps *a when its key equals key (no rebuild); otherwise rebuilds it. */
int kv_arena_ensure(kv_arena **a, const kv_key *key, ditto_err *err);
void kv_arena_free(kv_arena *a);
/* "kv arena: 8 slots x 4096 ctx x 48 layers x 4 kv-heads x 128 x 2 x f16 = 6.0 GiB" */
void kv_arena_describe(const kv_arena *a, char *buf, size_t n);

/* Lowest free slot index (marked used, len 0), or -1 when all are taken. */
int kv_slot_acquire(kv_arena *a);
void kv_slot_release(kv_arena *a, int slot);

#define KV_POS_GROUP 16 /* positions interleaved in the K layout */

/* K element (pos, d) within a (slot, layer, head) K region. */
static inline size_t kv_k_index(int pos, int d, int head_dim) {
    return ((size_t)(pos / KV_POS_GROUP) * (size_t)head_dim + (size_t)d) * KV_POS_GROUP + (size_t)(pos % KV_POS_GROUP);
}

/* The K or V region of (slot, layer, kv head): ctx x head_dim halves (layouts above). */
static inline fp16_t *kv_ptr(const kv_arena *a, int slot, int layer, int kv, int head) {
    const kv_key *k = &a->key;
    size_t idx = ((((size_t)slot * k->n_layer + layer) * 2 + kv) * k->n_head_kv + head) * (size_t)k->ctx;
    return a->mem + idx * (size_t)k->head_dim;
}

#endif
