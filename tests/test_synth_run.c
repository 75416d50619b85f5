/* test_synth_run.c — ditto loads and runs every geometry synth writes (odd heads,
 * one layer, experts-used 1 and all, dense qwen3, each type) with finite logits,
 * and batched decode equals solo decode on them. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "sched.h"
#include "synth.h"
#include "test.h"

typedef struct geo {
    const char *name;
    uint32_t layers, hidden, heads, kv, hd, experts, used, effn, dffn;
    enum synth_type type;
} geo;

static const geo geos[] = {
    {"1 layer q4_k_m", 1, 256, 4, 2, 64, 8, 2, 256, 0, SYNTH_Q4_K_M},
    {"odd heads 3/1 q8_0", 2, 192, 3, 1, 64, 4, 2, 96, 0, SYNTH_Q8_0},
    {"experts-used 1 q4_0", 2, 256, 4, 4, 64, 8, 1, 128, 0, SYNTH_Q4_0},
    {"experts-used = experts q4_k_m", 2, 256, 2, 1, 128, 4, 4, 256, 0, SYNTH_Q4_K_M},
    {"dense qwen3 q4_k_m", 2, 256, 4, 2, 64, 0, 0, 0, 512, SYNTH_Q4_K_M},
    {"dense qwen3 q8_0, 5 heads", 3, 320, 5, 5, 64, 0, 0, 0, 224, SYNTH_Q8_0},
    {"q5_k_m, expert ffn 96 (Q8_0 experts)", 2, 256, 4, 2, 64, 8, 2, 96, 0, SYNTH_Q5_K_M},
    {"groups of 4 heads q4_k_m, expert ffn 768", 2, 256, 8, 2, 64, 8, 2, 768, 0, SYNTH_Q4_K_M},
};

/* Greedy tokens + step hashes of one prompt alone (1 slot) and beside 3 others (4 slots, 2 threads). */
static void run_model(const char *path, const char *name) {
    model *m;
    ditto_err err;
    if (model_load(&m, path, &err)) {
        CHECK(0, "%s: load: %s", name, err.msg);
        return;
    }
    int32_t prompts[4][6] = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {100, 200, 300, 400, 500, 600}, {5, 4, 3, 2, 1, 0}};
    uint64_t solo_h[8], h[8];
    int32_t solo_t[8], t[8];
    bool finite = true;
    for (int mode = 0; mode < 2; mode++) {
        engine_opts o;
        engine_opts_default(&o);
        o.max_streams = mode ? 4 : 1;
        o.n_threads = mode ? 2 : 1;
        o.ctx = 32;
        o.max_rows = 16;
        engine *e;
        if (engine_create(&e, m, &o, &err)) {
            CHECK(0, "%s: engine: %s", name, err.msg);
            break;
        }
        sched_opts so;
        sched_opts_default(&so);
        so.prefill_chunk = 4;
        sched *s;
        sched_create(&s, e, &so, &err);
        sched_stream *hs[4] = {0};
        int n = mode ? 4 : 1;
        for (int i = 0; i < n; i++) {
            sched_request r = {.prompt = prompts[i], .n_prompt = 6, .max_tokens = 8, .ignore_eos = true,
                               .record_hashes = true};
            sampler_params_default(&r.sampling);
            CHECK(sched_submit(s, &r, &hs[i], &err) == SCHED_OK, "%s: submit: %s", name, err.msg);
        }
        while (!sched_idle(s)) {
            CHECK(sched_step(s, &err) >= 0, "%s: step", name);
            const float *lg = e->logits;
            for (int v = 0; v < m->hp.n_vocab; v++)
                if (!isfinite(lg[v])) finite = false;
        }
        int got;
        sched_stream_read(s, hs[0], mode ? t : solo_t, 8, &got, 0);
        CHECK(got == 8, "%s: got %d tokens", name, got);
        sched_stream_hashes(s, hs[0], mode ? h : solo_h, 8);
        for (int i = 0; i < n; i++) sched_stream_release(s, hs[i]);
        sched_free(s);
        engine_free(e);
    }
    CHECK(finite, "%s: non-finite logits", name);
    CHECK(memcmp(solo_h, h, sizeof h) == 0 && memcmp(solo_t, t, sizeof t) == 0, "%s: batched != solo", name);
    printf("%-42s loads, runs, finite logits, batched == solo: %s\n", name,
           finite && memcmp(solo_h, h, sizeof h) == 0 ? "yes" : "NO");
    model_free(m);
}

int main(void) {
    char path[] = "/tmp/ditto-synth-run-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    for (size_t i = 0; i < sizeof geos / sizeof *geos; i++) {
        const geo *g = &geos[i];
        synth_params p;
        synth_params_preset(&p, "tiny");
        p.n_layers = g->layers, p.hidden = g->hidden, p.n_heads = g->heads, p.n_kv_heads = g->kv;
        p.head_dim = g->hd, p.n_experts = g->experts, p.n_experts_used = g->used, p.expert_ffn = g->effn;
        p.dense_ffn = g->dffn ? g->dffn : p.dense_ffn;
        p.vocab = 1000, p.ctx = 64, p.type = g->type, p.seed = i + 1, p.tokenizer_from = NULL, p.quiet = true;
        p.tie_output = i % 2;
        ditto_err err;
        if (synth_write(&p, path, &err)) {
            CHECK(0, "%s: synth: %s", g->name, err.msg);
            continue;
        }
        run_model(path, g->name);
    }
    unlink(path);
    return test_summary();
}
