/* test_profile.c — the backend's per-stage profile (ditto bench --profile): off by
 * default (all zero), on it accounts every weight byte of the step to the right stages,
 * its stage times fit inside the forward calls' wall time, the threads' spread at the end of
 * a stage's gemm work lies inside that stage's time (and only gemm stages have one), and
 * profiling never changes a logit bit. The calls profile counts every gemm stage's weight byte in
 * exactly one kind of kernel call, by tokens per call. The loads-only diagnostic reads weights and computes
 * nothing. An engine retuned between calls (engine_retune) keeps a stream's logits. */
#include <string.h>

#include "cpu/claim.h"
#include "cpu/cpu_quant.h"
#include "engine.h"
#include "test.h"

enum { STREAMS = 3, PROMPT = 5, STEPS = 4, MAXST = 32 };

/* Prefill of STREAMS prompts in one batch, then STEPS decode steps of all streams.
 * Returns the summed wall time of the forward calls; logits of every step in out. */
static double run(engine *e, float *out) {
    int32_t tok[STREAMS * PROMPT], pos[STREAMS * PROMPT], sl[STREAMS * PROMPT];
    uint8_t want[STREAMS * PROMPT];
    int V = e->m->hp.n_vocab, n = 0;
    for (int s = 0; s < STREAMS; s++) {
        int slot = kv_slot_acquire(e->kv);
        for (int p = 0; p < PROMPT; p++, n++) {
            tok[n] = 100 + 7 * s + p, pos[n] = p, sl[n] = slot, want[n] = p == PROMPT - 1;
        }
    }
    ditto_err err;
    double wall = 0;
    double t0 = time_now();
    engine_batch b = {n, tok, pos, sl, want};
    CHECK(engine_forward(e, &b, &err) == STREAMS, "prefill: %s", err.msg);
    wall += time_now() - t0;
    for (int step = 0; step < STEPS; step++) {
        int32_t dt[STREAMS], dp[STREAMS], ds[STREAMS];
        uint8_t dw[STREAMS];
        for (int s = 0; s < STREAMS; s++) {
            dt[s] = (int32_t)((step * 31 + s * 17) % 1000), dp[s] = PROMPT + step, ds[s] = sl[s * PROMPT], dw[s] = 1;
        }
        engine_batch d = {STREAMS, dt, dp, ds, dw};
        t0 = time_now();
        CHECK(engine_forward(e, &d, &err) == STREAMS, "decode step %d: %s", step, err.msg);
        wall += time_now() - t0;
        memcpy(out + (size_t)step * STREAMS * V, e->logits, sizeof(float) * STREAMS * (size_t)V);
    }
    return wall;
}

/* engine_create with o refuses, naming the option (needle in its message); what / value name the case. */
static void expect_refused(model *m, const engine_opts *o, const char *needle, const char *what, int value) {
    engine *e = NULL;
    ditto_err err;
    const int rc = engine_create(&e, m, o, &err);
    CHECK(rc != 0 && strstr(err.msg, needle), "%s %d refused (rc %d: %s)", what, value, rc, rc ? err.msg : "");
    if (!rc) engine_free(e);
}

/* One stream alone: its prompt, then STEPS one-row decode steps (the solo path, where the float
 * router's one-token kernels run); out: [STEPS][V]. With n > 0 the engine is retuned
 * (engine_retune) to seq[i % n] before the prefill and before each decode step: forms, float forms,
 * the solo step's form, claimed runs and requests ahead switched between the calls of one stream. */
static void run_solo_retuned(engine *e, const engine_opts *seq, int n, float *out) {
    int32_t tok[PROMPT], pos[PROMPT], sl[PROMPT];
    uint8_t want[PROMPT];
    const int V = e->m->hp.n_vocab, slot = kv_slot_acquire(e->kv);
    for (int p = 0; p < PROMPT; p++) tok[p] = 100 + 3 * p, pos[p] = p, sl[p] = slot, want[p] = p == PROMPT - 1;
    ditto_err err;
    if (n) CHECK(engine_retune(e, &seq[0], &err) == 0, "retune before the prefill: %s", err.msg);
    engine_batch b = {PROMPT, tok, pos, sl, want};
    CHECK(engine_forward(e, &b, &err) == 1, "solo prefill: %s", err.msg);
    for (int step = 0; step < STEPS; step++) {
        if (n) CHECK(engine_retune(e, &seq[(step + 1) % n], &err) == 0, "retune before step %d: %s", step, err.msg);
        int32_t dt = (step * 31 + 5) % 1000, dp = PROMPT + step;
        const uint8_t dw = 1;
        engine_batch d = {1, &dt, &dp, &slot, &dw};
        CHECK(engine_forward(e, &d, &err) == 1, "solo decode step %d: %s", step, err.msg);
        memcpy(out + (size_t)step * V, e->logits, sizeof(float) * (size_t)V);
    }
    kv_slot_release(e->kv, slot);
}
static void run_solo(engine *e, float *out) { run_solo_retuned(e, NULL, 0, out); }

/* engine_retune with o refuses, naming the field (needle), and leaves e running. */
static void expect_retune_refused(engine *e, const engine_opts *o, const char *needle, const char *what) {
    ditto_err err;
    const int rc = engine_retune(e, o, &err);
    CHECK(rc != 0 && strstr(err.msg, needle), "retune with %s refused (rc %d: %s)", what, rc, rc ? err.msg : "");
}

int main(void) {
    model *m;
    ditto_err err;
    if (model_load(&m, "models/tiny-qwen3moe-q4_k_m.gguf", &err)) {
        CHECK(0, "load: %s", err.msg);
        return test_summary();
    }
    const size_t nl = (size_t)STEPS * STREAMS * m->hp.n_vocab;
    float *lg[2] = {xmalloc(sizeof(float) * nl), xmalloc(sizeof(float) * nl)};
    uint64_t wb_model = 0; /* weight bytes the model's run read */
    for (int prof = 0; prof < 2; prof++) {
        engine_opts o;
        engine_opts_default(&o);
        o.n_threads = 2;
        o.max_streams = STREAMS;
        o.ctx = 32;
        o.max_rows = STREAMS * PROMPT;
        o.profile = prof;
        engine *e;
        if (engine_create(&e, m, &o, &err)) {
            CHECK(0, "engine: %s", err.msg);
            break;
        }
        uint64_t w0, k0, w1, k1;
        e->be->counters(e->be_state, &w0, &k0);
        double wall = run(e, lg[prof]);
        e->be->counters(e->be_state, &w1, &k1);
        wb_model = w1 - w0;
        backend_stage st[MAXST];
        int ns = e->be->profile(e->be_state, st, MAXST);
        CHECK(ns >= 10 && ns <= MAXST, "%d stages", ns);
        double sum_s = 0, sum_e = 0;
        uint64_t sum_b = 0;
        int named = 0, timed = 0;
        for (int i = 0; i < ns; i++) {
            named += st[i].name && st[i].name[0];
            for (int j = 0; j < i; j++) CHECK(strcmp(st[i].name, st[j].name), "stage name %s twice", st[i].name);
            CHECK(st[i].seconds >= 0, "%s: %g s", st[i].name, st[i].seconds);
            timed += st[i].seconds > 0;
            sum_s += st[i].seconds;
            sum_b += st[i].weight_bytes;
            sum_e += st[i].ends;
            CHECK(st[i].ends >= 0 && st[i].ends <= st[i].seconds, "%s: ends %g s of %g s", st[i].name, st[i].ends,
                  st[i].seconds);
        }
        CHECK(named == ns, "every stage named");
        /* the calls profile: the gemm stages' bytes (all but the embedding's), each in one kind */
        backend_calls cc[8];
        const int nc = e->be->calls(e->be_state, cc, 8);
        CHECK(nc == 5, "%d kinds of call", nc);
        uint64_t cb = 0, cn = 0, emb = 0;
        double cs = 0;
        for (int i = 0; i < ns; i++)
            if (!strcmp(st[i].name, "embed")) emb = st[i].weight_bytes;
        for (int k = 0; k < nc && k < 8; k++) {
            CHECK(cc[k].name && cc[k].name[0], "kind %d named", k);
            CHECK((cc[k].calls > 0) == (cc[k].weight_bytes > 0) && cc[k].thread_seconds >= 0, "%s: %llu calls, %llu bytes",
                  cc[k].name, (unsigned long long)cc[k].calls, (unsigned long long)cc[k].weight_bytes);
            cb += cc[k].weight_bytes, cn += cc[k].calls, cs += cc[k].thread_seconds;
        }
        if (!prof) {
            CHECK(cb == 0 && cn == 0 && cs == 0, "profile off: no calls counted (%llu, %g s)", (unsigned long long)cn, cs);
            CHECK(sum_s == 0 && sum_b == 0 && sum_e == 0 && timed == 0, "profile off: all zero (%g s, %g s, %llu bytes)",
                  sum_s, sum_e, (unsigned long long)sum_b);
        } else {
            CHECK(timed == ns, "profile on: %d of %d stages took time", timed, ns);
            CHECK(sum_b == w1 - w0, "stage bytes %llu == weight bytes read %llu", (unsigned long long)sum_b,
                  (unsigned long long)(w1 - w0));
            CHECK(sum_s <= wall + 1e-6, "stage times %.6f s inside the forward calls' %.6f s", sum_s, wall);
            CHECK(cb == sum_b - emb && emb > 0, "calls' bytes %llu == the gemm stages' %llu", (unsigned long long)cb,
                  (unsigned long long)(sum_b - emb));
            CHECK(cs > 0 && cs <= 2 * wall + 1e-6, "calls' thread time %.6f s within two threads' %.6f s", cs, wall);
            /* a prefill of STREAMS * PROMPT rows (over 8 tokens a call), decode steps of STREAMS rows
             * (their dense gemms three tokens a call), never a one-row step */
            CHECK(cc[4].calls > 0 && cc[3].calls > 0 && cc[0].calls == 0, "kinds: over 8 %llu, 3-8 %llu, one-row %llu",
                  (unsigned long long)cc[4].calls, (unsigned long long)cc[3].calls, (unsigned long long)cc[0].calls);
            /* weight bytes only where a stage reads weights: the gemm stages and the token
             * embeddings' */
            for (int i = 0; i < ns; i++) {
                bool gemm = strstr(st[i].name, "gemm") != NULL || strstr(st[i].name, "embed") != NULL;
                CHECK(gemm == (st[i].weight_bytes > 0), "%s: %llu weight bytes", st[i].name,
                      (unsigned long long)st[i].weight_bytes);
                CHECK(gemm || st[i].ends == 0, "%s: no gemm work, ends %g s", st[i].name, st[i].ends);
            }
        }
        engine_free(e);
    }
    CHECK(memcmp(lg[0], lg[1], sizeof(float) * nl) == 0, "logits with and without the profile bitwise equal");

    /* the loads-only diagnostic (ditto bench --loads-only-ab): the same steps read weight bytes
     * and compute nothing — every logit zero, where the model's are not. Off unless asked for,
     * whatever the struct held before engine_opts_default. */
    engine_opts o;
    memset(&o, 0xff, sizeof o);
    engine_opts_default(&o);
    CHECK(!o.cpu_loads_only && !o.unify && !o.profile, "engine_opts_default: the diagnostic and the switches off");
    o.n_threads = 2, o.max_streams = STREAMS, o.ctx = 32, o.max_rows = STREAMS * PROMPT, o.cpu_loads_only = true;
    /* in this host's stream form, then in two-l1 (its own load pattern where AVX-512 runs it) */
    for (int f = 0; f < 2; f++) {
        o.cpu_stream = f ? (int)CPU_STREAM_TWO_L1 : -1;
        engine *e;
        if (engine_create(&e, m, &o, &err)) CHECK(0, "loads-only engine: %s", err.msg);
        else {
            uint64_t w0, k0, w1, k1;
            e->be->counters(e->be_state, &w0, &k0);
            run(e, lg[1]);
            e->be->counters(e->be_state, &w1, &k1);
            size_t nz0 = 0, nz1 = 0;
            for (size_t i = 0; i < nl; i++) nz0 += lg[0][i] != 0, nz1 += lg[1][i] != 0;
            CHECK(nz1 == 0 && nz0 > 0, "loads only (form %d): %zu nonzero logits of %zu (the model's: %zu)", f, nz1, nl, nz0);
            /* its routing (a hash of matrix, row and token) picks other experts than the model's */
            CHECK(w1 - w0 > wb_model / 2, "loads only (form %d): %llu weight bytes read, the model's steps %llu", f,
                  (unsigned long long)(w1 - w0), (unsigned long long)wb_model);
            engine_free(e);
        }
    }
    /* the claimed-run cap (ditto bench --claim-runs-ab): any in range gives the same logits (which
     * thread computes a row never changes its bits); out of range is refused by name */
    o.cpu_loads_only = false, o.cpu_stream = -1;
    const int good_runs[] = {1, CLAIM_RUNS_MAX};
    for (int i = 0; i < 2; i++) {
        o.cpu_claim_runs = good_runs[i];
        engine *e = NULL;
        if (engine_create(&e, m, &o, &err)) {
            CHECK(0, "cpu_claim_runs %d: %s", good_runs[i], err.msg);
            continue;
        }
        run(e, lg[1]);
        CHECK(memcmp(lg[0], lg[1], sizeof(float) * nl) == 0, "cpu_claim_runs %d: logits bitwise equal", good_runs[i]);
        engine_free(e);
    }
    const int bad_runs[] = {0, -2, 1025};
    for (int i = 0; i < 3; i++) {
        o.cpu_claim_runs = bad_runs[i];
        expect_refused(m, &o, "claim runs", "cpu_claim_runs", bad_runs[i]);
    }
    /* the float kernels' one-token form (ditto bench --float-form-ab): every form gives a solo
     * stream the same logits as this host's; out of range is refused by name */
    o.cpu_claim_runs = -1;
    const size_t ns = (size_t)STEPS * m->hp.n_vocab;
    for (int f = -1; f < CPU_STREAM_COUNT; f++) {
        o.cpu_float_form = f;
        engine *e = NULL;
        if (engine_create(&e, m, &o, &err)) {
            CHECK(0, "cpu_float_form %d: %s", f, err.msg);
            continue;
        }
        run_solo(e, lg[f < 0 ? 0 : 1]);
        if (f >= 0)
            CHECK(memcmp(lg[0], lg[1], sizeof(float) * ns) == 0, "cpu_float_form %s: solo logits bitwise equal",
                  cpu_stream_name((enum cpu_stream)f));
        engine_free(e);
    }
    const int bad_forms[] = {-2, CPU_STREAM_COUNT};
    for (int i = 0; i < 2; i++) {
        o.cpu_float_form = bad_forms[i];
        expect_refused(m, &o, "float form", "cpu_float_form", bad_forms[i]);
    }
    o.cpu_float_form = -1;
    for (int i = 0; i < 2; i++) { /* the stream form's own bounds, the same */
        o.cpu_stream = bad_forms[i];
        expect_refused(m, &o, "stream form", "cpu_stream", bad_forms[i]);
    }
    /* engine_retune (ditto bench --switch): one engine switched between option sets from call to
     * call gives a solo stream the logits of an engine left at the defaults (lg[0], the float-form
     * loop's first run), bit for bit; a change of shape is refused by name and leaves it running */
    o.cpu_stream = -1;
    engine_opts seq[4] = {o, o, o, o};
    seq[0].cpu_stream = CPU_STREAM_NEAR_FAR, seq[0].cpu_ahead = 0;
    seq[1].cpu_stream = CPU_STREAM_PLAIN, seq[1].cpu_one_job = 1, seq[1].cpu_claim_runs = 1;
    seq[2].cpu_stream = CPU_STREAM_TWO_L1, seq[2].cpu_float_form = CPU_STREAM_NEAR_FAR, seq[2].cpu_claim_runs = 3;
    seq[3].cpu_stream = CPU_STREAM_TOUCH, seq[3].cpu_one_job = 0, seq[3].cpu_ahead = 1 << 20;
    engine *er = NULL;
    if (engine_create(&er, m, &o, &err)) CHECK(0, "engine to retune: %s", err.msg);
    else {
        run_solo_retuned(er, seq, 4, lg[1]);
        CHECK(memcmp(lg[0], lg[1], sizeof(float) * ns) == 0, "retuned between calls: solo logits bitwise equal");
        engine_opts bad = o;
        bad.n_threads = 3;
        expect_retune_refused(er, &bad, "threads", "another thread count");
        bad = o, bad.max_streams = STREAMS + 1;
        expect_retune_refused(er, &bad, "streams", "another stream count");
        bad = o, bad.ctx = 64;
        expect_retune_refused(er, &bad, "ctx", "another context cap");
        bad = o, bad.max_rows = 7;
        expect_retune_refused(er, &bad, "max rows", "another row count");
        bad = o, bad.profile = true;
        expect_retune_refused(er, &bad, "profile", "profiling");
        bad = o, bad.cpu_stream = CPU_STREAM_COUNT;
        expect_retune_refused(er, &bad, "stream form", "a stream form out of range");
        bad = o, bad.cpu_claim_runs = 0;
        expect_retune_refused(er, &bad, "claim runs", "claim runs 0");
        run_solo_retuned(er, &o, 1, lg[1]); /* the refusals changed nothing */
        CHECK(memcmp(lg[0], lg[1], sizeof(float) * ns) == 0, "after the refused retunes: solo logits bitwise equal");
        /* a retune takes effect: the engine names the new form, and the loads-only diagnostic computes nothing */
        if (cpu_level_detect() >= CPU_AVX2) {
            CHECK(engine_retune(er, &seq[0], &err) == 0 && strstr(er->be->describe(er->be_state), "weight stream near-far"),
                  "retuned to near-far: the backend says so (%s)", er->be->describe(er->be_state));
            engine_opts lo = o;
            lo.cpu_loads_only = true;
            run_solo_retuned(er, &lo, 1, lg[1]);
            size_t nz = 0;
            for (size_t i = 0; i < ns; i++) nz += lg[1][i] != 0;
            CHECK(nz == 0, "retuned to loads only: %zu nonzero logits of %zu", nz, ns);
            run_solo_retuned(er, &o, 1, lg[1]);
            CHECK(memcmp(lg[0], lg[1], sizeof(float) * ns) == 0, "retuned back from loads only: solo logits bitwise equal");
        }
        engine_free(er);
    }
    free(lg[0]);
    free(lg[1]);
    model_free(m);
    return test_summary();
}
