/* test_synth_run.c — ditto loads and runs every geometry synth writes (odd heads,
 * one layer, experts-used 1 and all, dense qwen3, each type) with finite logits,
 * and batched decode equals solo decode on them, as does solo decode on 2 and 3 threads
 * with the step as one pool job (cpu_backend.c, solo_task) where the geometry allows it. */
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
    bool one_job; /* solo steps run as one pool job (MoE) */
} geo;

static const geo geos[] = {
    {"1 layer q4_k_m", 1, 256, 4, 2, 64, 8, 2, 256, 0, SYNTH_Q4_K_M, true},
    {"odd heads 3/1 q8_0", 2, 192, 3, 1, 64, 4, 2, 96, 0, SYNTH_Q8_0, true},
    {"experts-used 1 q4_0", 2, 256, 4, 4, 64, 8, 1, 128, 0, SYNTH_Q4_0, true},
    {"experts-used = experts q4_k_m", 2, 256, 2, 1, 128, 4, 4, 256, 0, SYNTH_Q4_K_M, true},
    {"dense qwen3 q4_k_m", 2, 256, 4, 2, 64, 0, 0, 0, 512, SYNTH_Q4_K_M, false},
    {"dense qwen3 q8_0, 5 heads", 3, 320, 5, 5, 64, 0, 0, 0, 224, SYNTH_Q8_0, false},
    {"q5_k_m, expert ffn 96 (Q8_0 experts)", 2, 256, 4, 2, 64, 8, 2, 96, 0, SYNTH_Q5_K_M, true},
    {"groups of 4 heads q4_k_m, expert ffn 768", 2, 256, 8, 2, 64, 8, 2, 768, 0, SYNTH_Q4_K_M, true},
    {"4 kv heads of 2, q4_0, 3 of 8 experts", 2, 256, 8, 4, 128, 8, 3, 128, 0, SYNTH_Q4_0, true},
    {"4 kv heads of 4, q8_0", 2, 192, 16, 4, 64, 8, 2, 96, 0, SYNTH_Q8_0, true},
};

/* Greedy tokens + step hashes of one prompt alone (1 slot, 1 thread), beside 3 others (4 slots, 2
 * threads) and alone on 2 and 3 threads with the solo step as one pool job. */
static void run_model(const char *path, const char *name, bool one_job) {
    model *m;
    ditto_err err;
    if (model_load(&m, path, &err)) {
        CHECK(0, "%s: load: %s", name, err.msg);
        return;
    }
    int32_t prompts[4][6] = {{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}, {100, 200, 300, 400, 500, 600}, {5, 4, 3, 2, 1, 0}};
    uint64_t solo_h[8], h[3][8];
    int32_t solo_t[8], t[3][8];
    bool finite = true, ran_one_job[2] = {false, false};
    memset(h, 0, sizeof h);
    memset(t, 0, sizeof t);
    for (int mode = 0; mode < 4; mode++) {
        engine_opts o;
        engine_opts_default(&o);
        o.max_streams = mode == 1 ? 4 : 1;
        o.n_threads = mode == 0 ? 1 : mode == 3 ? 3 : 2;
        o.cpu_one_job = mode >= 2;
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
        if (mode >= 2) ran_one_job[mode - 2] = strstr(e->be->describe(e->be_state), "one pool job") != NULL;
        sched_stream *hs[4] = {0};
        int n = mode == 1 ? 4 : 1;
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
        sched_stream_read(s, hs[0], mode ? t[mode - 1] : solo_t, 8, &got, 0);
        CHECK(got == 8, "%s: got %d tokens", name, got);
        sched_stream_hashes(s, hs[0], mode ? h[mode - 1] : solo_h, 8);
        for (int i = 0; i < n; i++) sched_stream_release(s, hs[i]);
        sched_free(s);
        engine_free(e);
    }
    CHECK(finite, "%s: non-finite logits", name);
    bool same[3];
    for (int k = 0; k < 3; k++) same[k] = !memcmp(solo_h, h[k], sizeof solo_h) && !memcmp(solo_t, t[k], sizeof solo_t);
    CHECK(same[0], "%s: batched != solo", name);
    CHECK(same[1] && same[2], "%s: solo on 2 / 3 threads (one job: %d / %d) != solo on 1: %d / %d", name,
          ran_one_job[0], ran_one_job[1], same[1], same[2]);
    CHECK(ran_one_job[0] == one_job && ran_one_job[1] == one_job, "%s: one pool job ran %d / %d, expected %d", name,
          ran_one_job[0], ran_one_job[1], one_job);
    printf("%-42s loads, runs, finite logits, batched == solo: %s; solo on 2 / 3 threads%s == solo: %s\n", name,
           finite && same[0] ? "yes" : "NO", one_job ? " (one pool job)" : "", same[1] && same[2] ? "yes" : "NO");
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
        run_model(path, g->name, g->one_job);
    }
    unlink(path);
    return test_summary();
}
