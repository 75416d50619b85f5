/* engine.c — session setup and batch validation around the backend. */
#include "engine.h"

#include <string.h>

void engine_opts_default(engine_opts *o) {
    memset(o, 0, sizeof *o); /* every flag off, every field set, also those added later */
    o->n_threads = 1;
    o->max_streams = 1;
    o->ctx = 4096;
    o->max_rows = 64;
    o->cpu_level = -1;
    o->cpu_stream = -1;
    o->cpu_ahead = -1;
    o->cpu_one_job = -1;
    o->cpu_claim_runs = -1;
    o->cpu_float_form = -1;
}

static backend_opts backend_opts_of(const engine_opts *o) {
    return (backend_opts){.n_threads = o->n_threads,
                          .max_rows = o->max_rows,
                          .cpu_level = o->cpu_level,
                          .cpu_stream = o->cpu_stream,
                          .cpu_ahead = o->cpu_ahead,
                          .cpu_one_job = o->cpu_one_job,
                          .cpu_claim_runs = o->cpu_claim_runs,
                          .cpu_float_form = o->cpu_float_form,
                          .profile = o->profile,
                          .cpu_loads_only = o->cpu_loads_only};
}

int engine_create(engine **out, model *m, const engine_opts *o, ditto_err *err) {
    *out = NULL;
    if (o->ctx < 1 || o->ctx > (1 << 24)) return err_set(err, "ctx = %d (must be 1..16M)", o->ctx);
    if (o->max_streams < 1 || o->max_streams > 4096)
        return err_set(err, "streams = %d (must be 1..4096)", o->max_streams);
    engine *e = xcalloc(1, sizeof *e);
    e->m = m;
    e->opts = *o;
    /* the arena holds ctx rounded up to whole K position groups; the cap stays o->ctx */
    int ctx_alloc = (o->ctx + KV_POS_GROUP - 1) / KV_POS_GROUP * KV_POS_GROUP;
    kv_key key = {m, o->max_streams, ctx_alloc, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim};
    if (kv_arena_create(&e->kv, &key, err)) {
        free(e);
        return -1;
    }
    e->be = &cpu_backend_ops;
    const backend_opts bo = backend_opts_of(o);
    if (e->be->create(&e->be_state, m, e->kv, &bo, err)) {
        kv_arena_free(e->kv);
        free(e);
        return -1;
    }
    /* calloc: large blocks come as untouched zero pages */
    e->logits = xcalloc((size_t)o->max_rows * (size_t)m->hp.n_vocab, sizeof(float));
    *out = e;
    return 0;
}

int engine_retune(engine *e, const engine_opts *o, ditto_err *err) {
    if (o->max_streams != e->opts.max_streams)
        return err_set(err, "streams = %d (the engine holds %d)", o->max_streams, e->opts.max_streams);
    if (o->ctx != e->opts.ctx) return err_set(err, "ctx = %d (the engine holds %d)", o->ctx, e->opts.ctx);
    const backend_opts bo = backend_opts_of(o);
    if (e->be->retune(e->be_state, &bo, err)) return -1;
    e->opts = *o;
    return 0;
}

void engine_free(engine *e) {
    if (!e) return;
    e->be->destroy(e->be_state);
    kv_arena_free(e->kv);
    free(e->logits);
    free(e);
}

int engine_host_threads(const engine *e) { return e->be->host_parallel ? e->opts.n_threads : 1; }

void engine_parallel(engine *e, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (e->be->host_parallel) e->be->host_parallel(e->be_state, fn, ctx);
    else fn(ctx, 0, 1);
}

int engine_forward(engine *e, const engine_batch *b, ditto_err *err) {
    if (b->n < 1 || b->n > e->opts.max_rows)
        return err_set(err, "batch of %d rows (must be 1..%d)", b->n, e->opts.max_rows);
    int n_out = 0;
    int next[b->n]; /* each row's expected position */
    for (int r = 0; r < b->n; r++) {
        int s = b->slot[r];
        if (s < 0 || s >= e->opts.max_streams || !e->kv->used[s])
            return err_set(err, "batch row %d: slot %d is not an acquired slot", r, s);
        if (b->token[r] < 0 || b->token[r] >= e->m->hp.n_vocab)
            return err_set(err, "batch row %d: token id %d outside the vocabulary (0..%d)", r, b->token[r],
                           e->m->hp.n_vocab - 1);
        int expect = e->kv->len[s];
        for (int q = 0; q < r; q++)
            if (b->slot[q] == s) expect = next[q] + 1;
        if (b->pos[r] != expect)
            return err_set(err, "batch row %d: slot %d position %d, expected %d", r, s, b->pos[r], expect);
        if (b->pos[r] >= e->opts.ctx)
            return err_set(err, "batch row %d: position %d reaches the context cap %d", r, b->pos[r], e->opts.ctx);
        next[r] = b->pos[r];
        n_out += b->want_logits[r] != 0;
    }
    bool solo = b->n == 1 && !e->opts.unify;
    e->be->forward(e->be_state, b, solo, e->logits);
    if (solo)
        e->n_solo++;
    else
        e->n_batched++;
    for (int r = 0; r < b->n; r++) e->kv->len[b->slot[r]] = b->pos[r] + 1;
    return n_out;
}

uint64_t engine_hash_floats(const float *x, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint8_t *p = (const uint8_t *)x;
    for (size_t i = 0; i < n * sizeof(float); i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}
