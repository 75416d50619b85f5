/* test_sched.c — same bytes under continuous batching: every stream's tokens and
 * per-step logits hashes equal its solo run, whatever joins, finishes or is
 * cancelled around it, at any thread count; slots and the arena behave. */
#include <string.h>

#include "engine.h"
#include "sched.h"
#include "test.h"

#define MAXTOK 48

typedef struct spec {
    int32_t prompt[40];
    int n_prompt, max_tokens;
    sampler_params sp;
    int arrive, cancel_at; /* step numbers; cancel_at < 0: never */
} spec;

typedef struct result {
    int32_t tok[MAXTOK];
    uint64_t hash[MAXTOK];
    int n;
    enum sched_finish fin;
    int slot_seen;
} result;

static model *g_model;

static engine *mk_engine(int threads, int streams, int ctx, int rows, bool unify) {
    engine_opts o;
    engine_opts_default(&o);
    o.n_threads = threads;
    o.max_streams = streams;
    o.ctx = ctx;
    o.max_rows = rows;
    o.unify = unify;
    engine *e;
    ditto_err err;
    if (engine_create(&e, g_model, &o, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        exit(1);
    }
    return e;
}

static sched *mk_sched(engine *e, int chunk) {
    sched_opts so;
    sched_opts_default(&so);
    so.prefill_chunk = chunk;
    so.max_queue = 512;
    sched *s;
    ditto_err err;
    if (sched_create(&s, e, &so, &err)) {
        fprintf(stderr, "sched: %s\n", err.msg);
        exit(1);
    }
    return s;
}

static sched_request req_of(const spec *sp) {
    sched_request r = {0};
    r.prompt = sp->prompt;
    r.n_prompt = sp->n_prompt;
    r.max_tokens = sp->max_tokens;
    r.sampling = sp->sp;
    r.record_hashes = true;
    return r;
}

static void collect(sched *s, sched_stream *h, result *r) {
    int n;
    while (sched_stream_read(s, h, r->tok + r->n, MAXTOK - r->n, &n, 0) != SCHED_DONE || n) {
        r->n += n;
        if (!n) break;
    }
}

/* Runs specs through one scheduler with arrivals/cancels at given steps. */
static void run_schedule(sched *s, const spec *specs, int n, result *res) {
    sched_stream **h = xcalloc((size_t)n, sizeof *h);
    memset(res, 0, sizeof(result) * (size_t)n);
    int done = 0;
    for (int step = 0; done < n && step < 100000; step++) {
        for (int i = 0; i < n; i++) {
            if (specs[i].arrive == step) {
                sched_request r = req_of(&specs[i]);
                ditto_err err;
                CHECK(sched_submit(s, &r, &h[i], &err) == SCHED_OK, "submit %d: %s", i, err.msg);
                res[i].slot_seen = -1;
            }
            if (h[i] && specs[i].cancel_at == step) sched_cancel(s, h[i]);
        }
        ditto_err err;
        CHECK(sched_step(s, &err) >= 0, "step: %s", err.msg);
        for (int i = 0; i < n; i++) {
            if (!h[i]) continue;
            int slot = sched_stream_slot(s, h[i]);
            if (slot >= 0) res[i].slot_seen = slot;
            int got;
            enum sched_state stt = sched_stream_read(s, h[i], res[i].tok + res[i].n, MAXTOK - res[i].n, &got, 0);
            res[i].n += got;
            if (stt == SCHED_DONE) {
                collect(s, h[i], &res[i]);
                res[i].fin = sched_stream_finish(s, h[i]);
                sched_stream_hashes(s, h[i], res[i].hash, MAXTOK);
                sched_stream_release(s, h[i]);
                h[i] = NULL;
                done++;
            }
        }
    }
    CHECK(done == n, "schedule finished %d of %d streams", done, n);
    free(h);
}

/* Alone: fresh single-slot engine, one thread, whole prompt in one chunk. */
static void run_solo(const spec *sp, result *r, bool unify) {
    engine *e = mk_engine(1, 1, 128, 64, unify);
    sched *s = mk_sched(e, 64);
    spec one = *sp;
    one.arrive = 0;
    one.cancel_at = -1;
    run_schedule(s, &one, 1, r);
    sched_free(s);
    engine_free(e);
}

static bool same(const result *a, const result *b, int n) {
    return a->n >= n && b->n >= n && memcmp(a->tok, b->tok, sizeof(int32_t) * (size_t)n) == 0 &&
           memcmp(a->hash, b->hash, sizeof(uint64_t) * (size_t)n) == 0;
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void random_spec(spec *sp, uint64_t *rng, int max_prompt) {
    sp->n_prompt = 1 + (int)(rng_next(rng) % (uint64_t)max_prompt);
    for (int j = 0; j < sp->n_prompt; j++) sp->prompt[j] = (int32_t)(rng_next(rng) % 20000);
    sp->max_tokens = 1 + (int)(rng_next(rng) % 12);
    sampler_params_default(&sp->sp);
    if (rng_next(rng) % 2) {
        sp->sp.temperature = 0.5f + (float)(rng_next(rng) % 100) / 100.0f;
        sp->sp.top_k = (int)(rng_next(rng) % 3) * 20;
        sp->sp.top_p = (rng_next(rng) % 2) ? 0.9f : 1.0f;
        sp->sp.min_p = (rng_next(rng) % 2) ? 0.05f : 0.0f;
        sp->sp.seed = rng_next(rng);
    }
    sp->cancel_at = -1;
}

static void test_ragged_six(void) {
    spec sp[6];
    uint64_t rng = 42;
    result solo[6], got[6];
    for (int i = 0; i < 6; i++) {
        random_spec(&sp[i], &rng, 30);
        sp[i].max_tokens = 4 + 3 * i;
        sp[i].sp.temperature = 0.0f;
        sp[i].arrive = i * 2;
        run_solo(&sp[i], &solo[i], false);
    }
    for (int rep = 0; rep < 5; rep++) {
        engine *e = mk_engine(1 + rep % 3, 8, 128, 8 + 16, false);
        sched *s = mk_sched(e, 7);
        run_schedule(s, sp, 6, got);
        int ok = 0;
        for (int i = 0; i < 6; i++) ok += same(&got[i], &solo[i], solo[i].n) && got[i].n == solo[i].n;
        CHECK(ok == 6, "ragged six rep %d: %d of 6 streams equal their solo runs", rep, ok);
        sched_free(s);
        engine_free(e);
    }
    printf("ragged six: 6 streams joining at steps 0..10, 5 repeats (threads 1..3): equal to solo\n");
}

static void test_six_copies(void) {
    spec sp[6];
    uint64_t rng = 7;
    random_spec(&sp[0], &rng, 20);
    sp[0].max_tokens = 16;
    sp[0].sp.temperature = 0.0f;
    for (int i = 0; i < 6; i++) sp[i] = sp[0], sp[i].arrive = 0;
    result solo, got[6];
    run_solo(&sp[0], &solo, false);
    engine *e = mk_engine(2, 6, 64, 6 + 64, false);
    sched *s = mk_sched(e, 64);
    run_schedule(s, sp, 6, got);
    int ok = 0;
    for (int i = 0; i < 6; i++) ok += same(&got[i], &solo, solo.n);
    CHECK(ok == 6, "six copies: %d of 6 equal to solo", ok);
    printf("six copies of one prompt at once: %d/6 identical to solo\n", ok);
    sched_free(s);
    engine_free(e);
}

static void test_unify(void) {
    spec sp;
    uint64_t rng = 99;
    random_spec(&sp, &rng, 20);
    sp.max_tokens = 12;
    result a, b;
    run_solo(&sp, &a, false);
    run_solo(&sp, &b, true);
    CHECK(same(&a, &b, a.n) && a.n == b.n, "unify: batched path differs from solo path");
    printf("unify: lone stream through the batched path: %s\n", same(&a, &b, a.n) ? "bitwise equal" : "DIFFERENT");
}

static void test_admission(void) {
    engine *e = mk_engine(1, 2, 32, 34, false);
    sched *s = mk_sched(e, 32);
    spec ok_spec;
    uint64_t rng = 5;
    random_spec(&ok_spec, &rng, 10);
    ok_spec.max_tokens = 8;
    ok_spec.sp.temperature = 0;
    result solo, got;
    run_solo(&ok_spec, &solo, false);
    sched_request r = req_of(&ok_spec);
    sched_stream *h;
    ditto_err err;
    CHECK(sched_submit(s, &r, &h, &err) == SCHED_OK, "submit");
    sched_step(s, &err);
    int32_t big[40] = {0};
    sched_request over = {.prompt = big, .n_prompt = 30, .max_tokens = 3};
    sampler_params_default(&over.sampling);
    sched_stream *h2;
    enum sched_status st = sched_submit(s, &over, &h2, &err);
    CHECK(st == SCHED_ERR_CONTEXT, "over-cap request: status %d", st);
    CHECK(strstr(err.msg, "30") && strstr(err.msg, "3") && strstr(err.msg, "32"), "error names the numbers: %s",
          err.msg);
    printf("admission: %s\n", err.msg);
    sched_request bad = over;
    bad.n_prompt = 1;
    bad.max_tokens = 0;
    CHECK(sched_submit(s, &bad, &h2, &err) == SCHED_ERR_INVALID, "max_tokens 0 rejected");
    memset(&got, 0, sizeof got);
    while (sched_step(s, &err) > 0) {
        int n;
        sched_stream_read(s, h, got.tok + got.n, MAXTOK - got.n, &n, 0);
        got.n += n;
    }
    collect(s, h, &got);
    sched_stream_hashes(s, h, got.hash, MAXTOK);
    CHECK(same(&got, &solo, solo.n), "stream beside a rejected request equals its solo run");
    sched_stream_release(s, h);
    sched_free(s);
    engine_free(e);
}

/* More simultaneous arrivals than queue places while slots are free (queue 0, 4 slots):
 * all are taken, none is lost or admitted twice, each equals its solo run. */
static void test_burst_small_queue(void) {
    engine *e = mk_engine(2, 4, 64, 4 + 16, false);
    sched_opts so;
    sched_opts_default(&so);
    so.max_queue = 0;
    so.prefill_chunk = 16;
    sched *s;
    ditto_err err;
    sched_create(&s, e, &so, &err);
    spec sp[4];
    result solo[4], got[4];
    sched_stream *h[4];
    uint64_t rng = 77;
    for (int i = 0; i < 4; i++) {
        random_spec(&sp[i], &rng, 12);
        run_solo(&sp[i], &solo[i], false);
        sched_request r = req_of(&sp[i]);
        CHECK(sched_submit(s, &r, &h[i], &err) == SCHED_OK, "burst submit %d: %s", i, err.msg);
    }
    sched_request r5 = req_of(&sp[0]);
    sched_stream *h5;
    CHECK(sched_submit(s, &r5, &h5, &err) == SCHED_ERR_QUEUE_FULL, "fifth request with 4 slots taken and queue 0");
    int steps = 0;
    while (!sched_idle(s) && steps++ < 1000) CHECK(sched_step(s, &err) >= 0, "burst step: %s", err.msg);
    int ok = 0;
    for (int i = 0; i < 4; i++) {
        memset(&got[i], 0, sizeof got[i]);
        collect(s, h[i], &got[i]);
        sched_stream_hashes(s, h[i], got[i].hash, MAXTOK);
        ok += same(&got[i], &solo[i], solo[i].n) && got[i].n == solo[i].n;
        sched_stream_release(s, h[i]);
    }
    CHECK(ok == 4, "burst into a zero queue: %d of 4 streams equal their solo runs", ok);
    CHECK(e->kv->n_used == 0, "burst: slots leaked");
    printf("burst: 4 requests at once into 4 slots with queue 0: %d/4 equal to solo, 5th refused\n", ok);
    sched_free(s);
    engine_free(e);
}

static void test_randomized(void) {
    const int N = 200;
    spec *sp = xcalloc(N, sizeof *sp);
    result *solo = xcalloc(N, sizeof *solo), *got = xcalloc(N, sizeof *got);
    uint64_t rng = 2026;
    int arrive = 0;
    for (int i = 0; i < N; i++) {
        random_spec(&sp[i], &rng, 24);
        arrive += (int)(rng_next(&rng) % 3);
        sp[i].arrive = arrive;
        if (rng_next(&rng) % 8 == 0) sp[i].cancel_at = arrive + (int)(rng_next(&rng) % 10);
    }
    double t0 = time_now();
    for (int i = 0; i < N; i++) run_solo(&sp[i], &solo[i], false);
    printf("randomized: solo runs %.1f s\n", time_now() - t0);
    int slot_uses[8] = {0};
    for (int part = 0; part < 4; part++) {
        int lo = part * N / 4, hi = (part + 1) * N / 4;
        spec *sub = xcalloc((size_t)(hi - lo), sizeof *sub);
        for (int i = lo; i < hi; i++) {
            sub[i - lo] = sp[i];
            sub[i - lo].arrive -= sp[lo].arrive;
            if (sub[i - lo].cancel_at >= 0) sub[i - lo].cancel_at -= sp[lo].arrive;
        }
        engine *e = mk_engine(part + 1, 8, 64, 8 + 8, false);
        uint64_t gen = e->kv->generation;
        sched *s = mk_sched(e, 1 + part * 3);
        double t1 = time_now();
        run_schedule(s, sub, hi - lo, got + lo);
        printf("randomized: part %d (threads %d) %.1f s\n", part, part + 1, time_now() - t1);
        CHECK(e->kv->generation == gen, "arena generation changed");
        CHECK(e->kv->n_used == 0, "slots leaked: %d", e->kv->n_used);
        sched_free(s);
        engine_free(e);
        free(sub);
    }
    int ok = 0, cancelled = 0;
    for (int i = 0; i < N; i++) {
        if (got[i].slot_seen >= 0) slot_uses[got[i].slot_seen]++;
        if (sp[i].cancel_at >= 0 && got[i].fin == SCHED_FINISH_CANCEL) {
            cancelled++;
            ok += same(&got[i], &solo[i], got[i].n); /* what it produced is a prefix of solo */
        } else {
            ok += same(&got[i], &solo[i], solo[i].n) && got[i].n == solo[i].n && got[i].fin == solo[i].fin;
        }
    }
    CHECK(ok == N, "randomized: %d of %d streams equal their solo runs", ok, N);
    int reused = 0;
    for (int i = 0; i < 8; i++) reused += slot_uses[i] > 1;
    CHECK(reused >= 4, "slots reused: only %d slots served more than one stream", reused);
    printf("randomized: %d streams (%d cancelled), 8 slots (uses per slot: %d %d %d %d %d %d %d %d), threads 1..4: "
           "%d/%d equal to solo\n",
           N, cancelled, slot_uses[0], slot_uses[1], slot_uses[2], slot_uses[3], slot_uses[4], slot_uses[5],
           slot_uses[6], slot_uses[7], ok, N);
    free(sp);
    free(solo);
    free(got);
}

static void test_arena(void) {
    engine *e = mk_engine(1, 8, 64, 16, false);
    kv_arena *a = e->kv;
    uint64_t gen = a->generation;
    fp16_t *mem = a->mem;
    for (int i = 0; i < 5000; i++) {
        int s = kv_slot_acquire(a);
        CHECK(s >= 0, "acquire");
        if (i % 3 == 0) {
            int s2 = kv_slot_acquire(a);
            kv_slot_release(a, s2);
        }
        kv_slot_release(a, s);
    }
    CHECK(a->generation == gen && a->mem == mem, "arena rebuilt or moved by joins/finishes");
    kv_key same_key = a->key;
    ditto_err err;
    CHECK(kv_arena_ensure(&e->kv, &same_key, &err) == 0 && e->kv == a && a->generation == gen,
          "same key must keep the arena");
    const model_hparams *hp = &g_model->hp;
    size_t formula = (size_t)8 * 64 * hp->n_layer * hp->n_head_kv * hp->head_dim * 2 * 2;
    CHECK(a->bytes == formula, "arena bytes %zu != formula %zu", a->bytes, formula);
    char line[256];
    kv_arena_describe(a, line, sizeof line);
    char want[64];
    snprintf(want, sizeof want, "= %zu bytes", formula);
    CHECK(strstr(line, want) != NULL, "describe prints the formula's bytes: %s", line);
    printf("%s; generation %llu after 5000 joins/finishes\n", line, (unsigned long long)a->generation);
    kv_key other = a->key;
    other.max_streams = 4;
    CHECK(kv_arena_ensure(&e->kv, &other, &err) == 0 && e->kv->generation == gen + 1, "key change rebuilds");
    engine_free(e);
}

/* The scheduler's solo run of each oracle prompt gives the oracle's greedy tokens (all 32 match
 * the engine-core run on q4_k_m, see test_oracle). */
static void test_solo_parity(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/reference/tiny-qwen3moe/oracle-q4_k_m.json", test_shared_dir());
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "open %s", path);
    if (!f) return;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int ok = 0, total = 0;
    char *p = buf;
    while ((p = strstr(p, "\"prompt_ids\""))) {
        spec sp = {0};
        char *q = strchr(p, '[') + 1;
        for (;;) {
            while (*q == ' ' || *q == '\n' || *q == ',') q++;
            if (*q == ']' || !*q || sp.n_prompt == 40) break;
            char *end;
            sp.prompt[sp.n_prompt++] = (int32_t)strtol(q, &end, 10);
            if (end == q) break;
            q = end;
        }
        int32_t want[32];
        q = strchr(strstr(q, "\"greedy_ids\""), '[') + 1;
        for (int i = 0; i < 32; i++) {
            while (*q == ' ' || *q == '\n' || *q == ',') q++;
            want[i] = (int32_t)strtol(q, &q, 10);
        }
        sp.max_tokens = 32;
        sampler_params_default(&sp.sp);
        result r;
        engine *e = mk_engine(1, 1, 128, 64, false);
        sched *s = mk_sched(e, 64);
        sched_request rq = req_of(&sp);
        rq.ignore_eos = true;
        sched_stream *h;
        ditto_err err;
        sched_submit(s, &rq, &h, &err);
        memset(&r, 0, sizeof r);
        while (sched_step(s, &err) > 0) {
        }
        collect(s, h, &r);
        sched_stream_release(s, h);
        sched_free(s);
        engine_free(e);
        ok += r.n == 32 && memcmp(r.tok, want, sizeof want) == 0;
        total++;
        p = q;
    }
    CHECK(total == 4 && ok == 4, "solo parity: %d of %d prompts give the oracle's 32 greedy tokens", ok, total);
    printf("solo parity: %d/%d oracle prompts, 32/32 greedy tokens each\n", ok, total);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/models/tiny-qwen3moe-q4_k_m.gguf", test_shared_dir());
    ditto_err err;
    if (model_load(&g_model, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t0 = time_now();
    test_arena();
    test_solo_parity();
    test_admission();
    test_unify();
    test_six_copies();
    test_ragged_six();
    test_burst_small_queue();
    test_randomized();
    printf("(%.1f s)\n", time_now() - t0);
    model_free(g_model);
    return test_summary();
}
