/* test_synth.c — `ditto synth` models: odd geometries open cleanly with the
 * expected keys, tensor shapes and types; output is deterministic per seed;
 * dequantized weights have std ~ 1/sqrt(row length). */
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "synth.h"
#include "test.h"

static void tmp_path(char *buf, size_t n, const char *tag) {
    snprintf(buf, n, "/tmp/ditto_test_synth_%d_%s.gguf", (int)getpid(), tag);
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = xmalloc((size_t)n);
    *len = fread(b, 1, (size_t)n, fp);
    fclose(fp);
    return b;
}

/* Independent statement of the type rules (see the brief / synth.h). */
enum role { R_EMBD, R_OUTPUT, R_ATTN, R_ATTN_V, R_FFN, R_F32 };
static uint32_t expect_type(const synth_params *p, enum role r, uint64_t row) {
    uint32_t want;
    if (r == R_F32)
        want = QT_F32;
    else if (p->type == SYNTH_Q8_0)
        want = QT_Q8_0;
    else if (r == R_OUTPUT || (r == R_EMBD && p->tie_output))
        want = QT_Q6_K;
    else if (p->type == SYNTH_Q4_0)
        want = QT_Q4_0;
    else if (r == R_EMBD || r == R_ATTN_V)
        want = QT_Q6_K;
    else
        want = p->type == SYNTH_Q5_K_M ? QT_Q5_K : QT_Q4_K;
    uint32_t blck = quant_traits_of(want)->blck;
    if (row % blck == 0) return want;
    return row % 32 == 0 ? QT_Q8_0 : QT_F32;
}

/* Dequantizes up to max_rows rows of t; checks std ~ 1/sqrt(row), mean ~ 0. */
static void check_stats(const gguf_tensor *t, int max_rows) {
    const quant_traits *tr = quant_traits_of(t->type);
    uint64_t k = t->ne[0], rows = t->nbytes / quant_row_bytes(t->type, (int64_t)k);
    if (rows > (uint64_t)max_rows) rows = (uint64_t)max_rows;
    float *row = xmalloc((size_t)k * sizeof(float));
    double s = 0, s2 = 0;
    bool finite = true;
    /* sample rows spread over the whole tensor */
    uint64_t total_rows = t->nbytes / quant_row_bytes(t->type, (int64_t)k);
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t ri = r * (total_rows / rows);
        tr->dequant_row((const uint8_t *)t->data + ri * quant_row_bytes(t->type, (int64_t)k), row, (int64_t)k);
        for (uint64_t i = 0; i < k; i++) {
            finite = finite && isfinite(row[i]);
            s += row[i];
            s2 += (double)row[i] * row[i];
        }
    }
    double n = (double)(rows * k), mean = s / n, sd = sqrt(DT_MAX(s2 / n - mean * mean, 0.0));
    double want = 1.0 / sqrt((double)k);
    CHECK(finite, "%s: non-finite weights", t->name);
    CHECK(sd > 0.85 * want && sd < 1.15 * want, "%s (%s, row %llu): std %.5f, want %.5f", t->name, tr->name,
          (unsigned long long)k, sd, want);
    CHECK(fabs(mean) < 0.1 * want, "%s: mean %.6f vs std %.5f", t->name, mean, want);
    free(row);
}

static void check_tensor(const gguf_file *f, const synth_params *p, const char *name, enum role r, uint32_t n_dims,
                         uint64_t ne0, uint64_t ne1, uint64_t ne2) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    CHECK(t != NULL, "missing tensor %s", name);
    if (!t) return;
    CHECK(t->n_dims == n_dims && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2,
          "%s: shape %u [%llu %llu %llu], want %u [%llu %llu %llu]", name, t->n_dims, (unsigned long long)t->ne[0],
          (unsigned long long)t->ne[1], (unsigned long long)t->ne[2], n_dims, (unsigned long long)ne0,
          (unsigned long long)ne1, (unsigned long long)ne2);
    uint32_t want = expect_type(p, r, ne0);
    CHECK(t->type == want, "%s: type %u, want %u", name, t->type, want);
    if (strstr(name, "norm")) {
        bool ones = true;
        for (uint64_t i = 0; i < t->ne[0]; i++) ones = ones && ((const float *)t->data)[i] == 1.0f;
        CHECK(t->type == QT_F32 && ones, "%s: norm weights not all 1", name);
    } else {
        check_stats(t, 48);
    }
}

static void check_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t want) {
    char key[128];
    uint32_t v = 0;
    ditto_err err;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    CHECK(gguf_get_u32(f, key, &v, &err) == 0 && v == want, "%s = %u, want %u (%s)", key, v, want, err.msg);
}

/* Writes p to a temp file and checks everything about it. */
static void check_model(const synth_params *p, const char *tag) {
    char path[256];
    tmp_path(path, sizeof path, tag);
    ditto_err err = {{0}};
    int rc = synth_write(p, path, &err);
    CHECK(rc == 0, "%s: synth_write: %s", tag, err.msg);
    if (rc) return;
    gguf_file *f;
    rc = gguf_open(&f, path, &err);
    CHECK(rc == 0, "%s: gguf_open: %s", tag, err.msg);
    if (rc) {
        unlink(path);
        return;
    }
    bool moe = p->n_experts > 0;
    const char *arch = moe ? "qwen3moe" : "qwen3";
    char *a = NULL;
    CHECK(gguf_get_str(f, "general.architecture", &a, &err) == 0 && strcmp(a, arch) == 0, "%s: arch %s", tag,
          a ? a : "?");
    free(a);
    check_u32(f, arch, "block_count", p->n_layers);
    check_u32(f, arch, "context_length", p->ctx);
    check_u32(f, arch, "embedding_length", p->hidden);
    check_u32(f, arch, "feed_forward_length", p->dense_ffn);
    check_u32(f, arch, "attention.head_count", p->n_heads);
    check_u32(f, arch, "attention.head_count_kv", p->n_kv_heads);
    check_u32(f, arch, "attention.key_length", p->head_dim);
    check_u32(f, arch, "attention.value_length", p->head_dim);
    char key[128];
    float fv = 0;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    CHECK(gguf_get_f32(f, key, &fv, &err) == 0 && fv == 1e6f, "%s: %s", tag, key);
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    CHECK(gguf_get_f32(f, key, &fv, &err) == 0 && fv == 1e-6f, "%s: %s", tag, key);
    if (moe) {
        check_u32(f, arch, "expert_count", p->n_experts);
        check_u32(f, arch, "expert_used_count", p->n_experts_used);
        check_u32(f, arch, "expert_feed_forward_length", p->expert_ffn);
    } else {
        snprintf(key, sizeof key, "%s.expert_count", arch);
        CHECK(gguf_find_kv(f, key) == NULL, "%s: dense model has %s", tag, key);
    }
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (p->tokenizer_from)
        CHECK(tok && tok->arr_n == p->vocab && gguf_find_kv(f, "tokenizer.ggml.merges"), "%s: tokenizer", tag);
    else
        CHECK(tok == NULL, "%s: unexpected tokenizer", tag);

    uint64_t h = p->hidden, q = (uint64_t)p->n_heads * p->head_dim, kv = (uint64_t)p->n_kv_heads * p->head_dim;
    uint64_t per_layer = moe ? 12 : 11;
    CHECK(f->n_tensors == 2 + (p->tie_output ? 0 : 1) + p->n_layers * per_layer, "%s: %llu tensors", tag,
          (unsigned long long)f->n_tensors);
    check_tensor(f, p, "token_embd.weight", R_EMBD, 2, h, p->vocab, 1);
    check_tensor(f, p, "output_norm.weight", R_F32, 1, h, 1, 1);
    if (p->tie_output)
        CHECK(gguf_find_tensor(f, "output.weight") == NULL, "%s: tied model has output.weight", tag);
    else
        check_tensor(f, p, "output.weight", R_OUTPUT, 2, h, p->vocab, 1);
    for (uint32_t l = 0; l < p->n_layers; l++) {
        char n[96];
#define T(suffix, role, nd, a0, a1, a2)                                  \
    do {                                                                \
        snprintf(n, sizeof n, "blk.%u.%s.weight", l, suffix);           \
        check_tensor(f, p, n, role, nd, a0, a1, a2);                    \
    } while (0)
        T("attn_norm", R_F32, 1, h, 1, 1);
        T("attn_q", R_ATTN, 2, h, q, 1);
        T("attn_k", R_ATTN, 2, h, kv, 1);
        T("attn_v", R_ATTN_V, 2, h, kv, 1);
        T("attn_output", R_ATTN, 2, q, h, 1);
        T("attn_q_norm", R_F32, 1, p->head_dim, 1, 1);
        T("attn_k_norm", R_F32, 1, p->head_dim, 1, 1);
        T("ffn_norm", R_F32, 1, h, 1, 1);
        if (moe) {
            T("ffn_gate_inp", R_F32, 2, h, p->n_experts, 1);
            T("ffn_gate_exps", R_FFN, 3, h, p->expert_ffn, p->n_experts);
            T("ffn_up_exps", R_FFN, 3, h, p->expert_ffn, p->n_experts);
            T("ffn_down_exps", R_FFN, 3, p->expert_ffn, h, p->n_experts);
        } else {
            T("ffn_gate", R_FFN, 2, h, p->dense_ffn, 1);
            T("ffn_up", R_FFN, 2, h, p->dense_ffn, 1);
            T("ffn_down", R_FFN, 2, p->dense_ffn, h, 1);
        }
#undef T
    }
    gguf_close(f);
    unlink(path);
}

static synth_params small(void) {
    synth_params p;
    DT_ASSERT(synth_params_preset(&p, "tiny") == 0);
    p.n_layers = 1;
    p.vocab = 512;
    p.quiet = true;
    p.seed = 7;
    return p;
}

static void test_presets(void) {
    synth_params p;
    CHECK(synth_params_preset(&p, "30b-a3b") == 0 && p.n_layers == 48 && p.hidden == 2048 && p.n_heads == 32 &&
              p.n_kv_heads == 4 && p.head_dim == 128 && p.n_experts == 128 && p.n_experts_used == 8 &&
              p.expert_ffn == 768 && p.vocab == 151936 && !p.tie_output && p.type == SYNTH_Q4_K_M,
          "30b-a3b preset");
    CHECK(synth_params_preset(&p, "tiny") == 0 && p.n_layers == 2 && p.hidden == 256 && p.n_heads == 4 &&
              p.n_kv_heads == 2 && p.head_dim == 64 && p.n_experts == 8 && p.n_experts_used == 2 &&
              p.expert_ffn == 256,
          "tiny preset");
    CHECK(synth_params_preset(&p, "70b") == -1, "unknown preset");

    ditto_err err;
    p = small();
    CHECK(synth_validate(&p, &err) == 0, "small valid: %s", err.msg);
    p.n_heads = 3;
    CHECK(synth_validate(&p, &err) == -1 && strstr(err.msg, "kv-heads"), "3 heads / 2 kv: %s", err.msg);
    p = small();
    p.n_experts_used = 0;
    CHECK(synth_validate(&p, &err) == -1 && strstr(err.msg, "experts-used"), "0 used: %s", err.msg);
    p.n_experts_used = p.n_experts + 1;
    CHECK(synth_validate(&p, &err) == -1 && strstr(err.msg, "experts-used"), "used > experts: %s", err.msg);
    p = small();
    p.n_layers = 0;
    CHECK(synth_validate(&p, &err) == -1 && strstr(err.msg, "layers"), "0 layers: %s", err.msg);
    p = small();
    p.head_dim = 0;
    CHECK(synth_validate(&p, &err) == -1 && strstr(err.msg, "head-dim"), "head_dim 0: %s", err.msg);
    p = small();
    p.n_experts = 0;
    p.n_experts_used = 0; /* ignored when dense */
    CHECK(synth_validate(&p, &err) == 0, "dense with 0 used: %s", err.msg);

    CHECK(synth_fit_type(QT_Q4_K, 512) == QT_Q4_K && synth_fit_type(QT_Q4_K, 192) == QT_Q8_0 &&
              synth_fit_type(QT_Q6_K, 80) == QT_F32 && synth_fit_type(QT_Q4_0, 96) == QT_Q4_0,
          "synth_fit_type");
}

static void test_geometries(void) {
    synth_params p = small();
    p.tie_output = false;
    check_model(&p, "base");

    p = small(); /* odd heads, every expert used, q4_0 (attn_output row 192: Q8_0) */
    p.n_heads = 3;
    p.n_kv_heads = 1;
    p.n_experts = 4;
    p.n_experts_used = 4;
    p.type = SYNTH_Q4_0;
    p.tie_output = false;
    check_model(&p, "heads3");

    p = small(); /* one expert used, 5 heads of 32, hidden 96: K-quants fall back to Q8_0 */
    p.hidden = 96;
    p.n_heads = 5;
    p.n_kv_heads = 5;
    p.head_dim = 32;
    p.n_experts = 3;
    p.n_experts_used = 1;
    p.expert_ffn = 64;
    check_model(&p, "hidden96");

    p = small(); /* dense qwen3, q8_0 */
    p.n_layers = 2;
    p.n_experts = 0;
    p.n_experts_used = 0;
    p.dense_ffn = 384;
    p.type = SYNTH_Q8_0;
    check_model(&p, "dense8");

    p = small(); /* q5_k_m, untied */
    p.type = SYNTH_Q5_K_M;
    p.tie_output = false;
    check_model(&p, "q5km");

    p = small(); /* dense qwen3, q4_k_m, untied */
    p.n_experts = 0;
    p.hidden = 512;
    p.dense_ffn = 768;
    p.tie_output = false;
    check_model(&p, "densek");

    p = small(); /* rows of 80: F32 fallback */
    p.hidden = 80;
    p.head_dim = 16;
    p.n_heads = 2;
    p.n_kv_heads = 1;
    p.expert_ffn = 48;
    p.type = SYNTH_Q8_0;
    check_model(&p, "hidden80");

    p = small(); /* large rows: small scales (subnormal fp16 d) still give the right std */
    p.hidden = 4096;
    p.n_heads = 1;
    p.n_kv_heads = 1;
    p.head_dim = 256;
    p.n_experts = 2;
    p.n_experts_used = 1;
    p.expert_ffn = 8192;
    p.vocab = 256;
    p.tie_output = false;
    check_model(&p, "wide");
    p.type = SYNTH_Q4_0;
    check_model(&p, "wide40");
}

static void test_tokenizer(void) {
    char tok[1024];
    snprintf(tok, sizeof tok, "%s/models/tiny-qwen3moe-q4_k_m.gguf", test_shared_dir());
    if (access(tok, R_OK) != 0) {
        printf("shared tokenizer model not found (skipped)\n");
        return;
    }
    synth_params p = small();
    p.vocab = 151936;
    p.tokenizer_from = tok;
    check_model(&p, "tok");

    char path[256];
    tmp_path(path, sizeof path, "tokbad");
    p.vocab = 1000;
    ditto_err err;
    CHECK(synth_write(&p, path, &err) == -1 && strstr(err.msg, "vocab 1000") && strstr(err.msg, "151936"),
          "vocab mismatch: %s", err.msg);
    CHECK(access(path, F_OK) != 0, "failed synth left %s behind", path);
    p.tokenizer_from = "/nonexistent.gguf";
    CHECK(synth_write(&p, path, &err) == -1 && strstr(err.msg, "/nonexistent.gguf"), "missing tokenizer: %s",
          err.msg);
}

static void test_determinism(void) {
    char a[256], b[256];
    tmp_path(a, sizeof a, "det_a");
    tmp_path(b, sizeof b, "det_b");
    for (int type = SYNTH_Q4_K_M; type <= SYNTH_Q8_0; type++) {
        synth_params p = small();
        p.type = (enum synth_type)type;
        p.tie_output = false;
        p.hidden = 512; /* several chunks' worth is not needed: streams are chunk-independent */
        ditto_err err;
        size_t la = 0, lb = 0;
        CHECK(synth_write(&p, a, &err) == 0 && synth_write(&p, b, &err) == 0, "write: %s", err.msg);
        uint8_t *x = read_all(a, &la), *y = read_all(b, &lb);
        CHECK(x && y && la == lb && memcmp(x, y, la) == 0, "type %d: same seed, different bytes", type);
        free(y);
        p.seed = 8;
        CHECK(synth_write(&p, b, &err) == 0, "write: %s", err.msg);
        y = read_all(b, &lb);
        CHECK(x && y && la == lb && memcmp(x, y, la) != 0, "type %d: different seed, same bytes", type);
        /* only the data differ: the headers are equal */
        gguf_file *f;
        if (x && gguf_open_buffer(&f, x, la, "det", &err) == 0) {
            CHECK(memcmp(x, y, (size_t)f->data_start) == 0, "type %d: headers differ across seeds", type);
            gguf_close(f);
        }
        free(x);
        free(y);
    }
    unlink(a);
    unlink(b);
}

static int run_cmd(const char **args, int n) { return synth_cmd(n, (char **)args); }

static void test_cmd(void) {
    char path[256];
    tmp_path(path, sizeof path, "cmd");
    const char *ok[] = {"synth", "-o", path, "--preset", "tiny", "--layers", "1", "--vocab", "512",
                        "--type", "q8_0", "--seed", "42", "--quiet"};
    CHECK(run_cmd(ok, 14) == 0, "synth_cmd tiny");
    gguf_file *f;
    ditto_err err;
    if (gguf_open(&f, path, &err) == 0) {
        uint32_t v = 0;
        CHECK(gguf_get_u32(f, "qwen3moe.block_count", &v, &err) == 0 && v == 1, "cmd: layers override");
        const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
        CHECK(t && t->ne[1] == 512 && t->type == QT_Q8_0, "cmd: vocab and type");
        CHECK(gguf_find_kv(f, "tokenizer.ggml.tokens") == NULL, "cmd: no tokenizer for --vocab 512");
        gguf_close(f);
    } else {
        CHECK(0, "cmd output: %s", err.msg);
    }
    /* flags before --preset still override it */
    const char *order[] = {"synth", "--experts", "0", "--vocab", "256", "--preset", "tiny", "-o", path, "--quiet"};
    CHECK(run_cmd(order, 10) == 0, "synth_cmd dense");
    if (gguf_open(&f, path, &err) == 0) {
        CHECK(gguf_find_kv(f, "qwen3.block_count") != NULL && gguf_find_tensor(f, "blk.0.ffn_up.weight"),
              "cmd: dense qwen3");
        gguf_close(f);
    }
    unlink(path);
    const char *noout[] = {"synth", "--preset", "tiny"};
    CHECK(run_cmd(noout, 3) == 2, "missing -o");
    const char *bogus[] = {"synth", "-o", path, "--bogus", "1"};
    CHECK(run_cmd(bogus, 5) == 2, "unknown flag");
    const char *badtype[] = {"synth", "-o", path, "--type", "q5_k"};
    CHECK(run_cmd(badtype, 5) == 2, "bad type");
    const char *badnum[] = {"synth", "-o", path, "--layers", "x1"};
    CHECK(run_cmd(badnum, 5) == 2, "bad number");
    const char *neg[] = {"synth", "-o", path, "--layers", "-1"};
    CHECK(run_cmd(neg, 5) == 2, "negative number");
    const char *badpreset[] = {"synth", "-o", path, "--preset", "huge"};
    CHECK(run_cmd(badpreset, 5) == 2, "bad preset");
    const char *badgeo[] = {"synth", "-o", path, "--preset", "tiny", "--vocab", "512", "--heads", "3", "--quiet"};
    CHECK(run_cmd(badgeo, 10) == 1, "invalid geometry");
    CHECK(access(path, F_OK) != 0, "nothing written for invalid geometry");
    /* the default tokenizer source is models/ relative to the working directory */
    const char *deftok[] = {"synth", "-o", path, "--preset", "tiny", "--layers", "1", "--quiet"};
    if (access("models/tiny-qwen3moe-q4_k_m.gguf", R_OK) == 0) {
        CHECK(run_cmd(deftok, 8) == 0, "default tokenizer");
        if (gguf_open(&f, path, &err) == 0) {
            const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
            CHECK(kv && kv->arr_n == 151936 && gguf_find_tensor(f, "output.weight") == NULL,
                  "default tokenizer copied, tiny is tied");
            gguf_close(f);
        }
        unlink(path);
    } else {
        CHECK(run_cmd(deftok, 8) == 1, "missing default tokenizer is an error");
    }
    const char *novalue[] = {"synth", "-o"};
    CHECK(run_cmd(novalue, 2) == 2, "-o without a value");
}

/* Geometry that would size allocations or overflow an int is refused by name before anything is
 * allocated: a synthetic file with one metadata value patched (found by its key's bytes). */
static void test_bad_geometry(void) {
    char path[256], bad[256];
    tmp_path(path, sizeof path, "geo");
    tmp_path(bad, sizeof bad, "geobad");
    const char *args[] = {"synth", "-o", path, "--preset", "tiny", "--layers", "1", "--vocab", "512", "--quiet"};
    CHECK(run_cmd(args, 10) == 0, "synth for the geometry cases");
    size_t len = 0;
    uint8_t *b = read_all(path, &len);
    struct {
        const char *key;
        uint32_t value;
        const char *msg;
    } cases[] = {{"qwen3moe.block_count", 1u << 30, "block_count"},
                 {"qwen3moe.block_count", 1u << 20, "block_count"},
                 {"qwen3moe.attention.head_count", 1u << 30, "too large"},
                 {"qwen3moe.attention.head_count", 1u << 27, "too large"}};
    for (size_t i = 0; b && i < sizeof cases / sizeof cases[0]; i++) {
        size_t kl = strlen(cases[i].key);
        uint8_t *at = NULL;
        for (size_t o = 8; o + kl + 8 <= len && !at; o++)
            if (!memcmp(b + o, cases[i].key, kl) && (o < 8 || b[o - 8] == kl)) at = b + o + kl;
        CHECK(at != NULL, "%s found in the file", cases[i].key);
        if (!at) continue;
        uint8_t *c = xmalloc(len);
        memcpy(c, b, len);
        uint32_t v = cases[i].value;
        memcpy(c + (at - b) + 4, &v, 4); /* after the u32 value type */
        FILE *fp = fopen(bad, "wb");
        CHECK(fp && fwrite(c, 1, len, fp) == len, "write %s", bad);
        if (fp) fclose(fp);
        free(c);
        model *m = NULL;
        ditto_err err = {0};
        double t0 = time_now();
        int rc = model_load(&m, bad, &err);
        CHECK(rc != 0 && strstr(err.msg, cases[i].msg), "%s = %u refused naming '%s': %s", cases[i].key, v,
              cases[i].msg, rc ? err.msg : "loaded");
        CHECK(time_now() - t0 < 5.0, "%s = %u refused at once (%.1f s)", cases[i].key, v, time_now() - t0);
        if (!rc) model_free(m);
    }
    free(b);
    unlink(bad);
    unlink(path);
}

int main(void) {
    double t0 = time_now();
    test_presets();
    test_geometries();
    test_tokenizer();
    test_determinism();
    test_cmd();
    test_bad_geometry();
    printf("test_synth: %.1f s\n", time_now() - t0);
    return test_summary();
}
