/* synth.c — `ditto synth`: random-weight qwen3moe / qwen3 GGUF files.
 *
 * Each tensor's bytes come from its own splitmix64 stream (seeded by the run
 * seed and the tensor name), filled 8 bytes at a time; the block headers (d,
 * dmin, scales) are then rewritten from the random bytes already in place, so
 * the stream does not depend on the chunk size. Block scales are chosen so that
 * the dequantized weights have mean ~0 and std ~1/sqrt(row length):
 *   Q8_0 w = d*q,               q uniform int8        std(q)   = 73.9
 *   Q4_0 w = d*(q-8),           q uniform 0..15       rms      = 4.637
 *   Q4_K w = d*sc*q - 8d*m,     sc uniform 32..63, m = round(15 sc/16): mean ~0, std = 4.61 d sc
 *   Q6_K w = d*s*(q-32),        |s| uniform 64..127   std      = 18.47 d |s|
 * Q4_0 / Q8_0 d carries a +-25% per-block jitter; Q4_0 d and Q6_K s a random
 * sign (cancelling the -1/2 mean of the offset codes). */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"

#define SYNTH_CHUNK (8u << 20)          /* bytes generated per write, about */
#define SYNTH_DEFAULT_TOKENIZER "models/tiny-qwen3moe-q4_k_m.gguf"
#define SYNTH_QWEN_VOCAB 151936u

/* ---- presets / validation ------------------------------------------------------------ */

int synth_params_preset(synth_params *p, const char *name) {
    synth_params q = {0};
    if (strcmp(name, "30b-a3b") == 0) {
        q = (synth_params){.n_layers = 48, .hidden = 2048, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128,
                           .n_experts = 128, .n_experts_used = 8, .expert_ffn = 768, .dense_ffn = 6144,
                           .vocab = SYNTH_QWEN_VOCAB, .ctx = 40960, .tie_output = false};
    } else if (strcmp(name, "tiny") == 0) {
        q = (synth_params){.n_layers = 2, .hidden = 256, .n_heads = 4, .n_kv_heads = 2, .head_dim = 64,
                           .n_experts = 8, .n_experts_used = 2, .expert_ffn = 256, .dense_ffn = 512,
                           .vocab = SYNTH_QWEN_VOCAB, .ctx = 4096, .tie_output = true};
    } else {
        return -1;
    }
    q.type = SYNTH_Q4_K_M;
    *p = q;
    return 0;
}

static int check_range(const char *field, uint64_t v, uint64_t lo, uint64_t hi, ditto_err *err) {
    if (v < lo || v > hi)
        return err_set(err, "synth: %s = %llu is out of range (%llu..%llu)", field, (unsigned long long)v,
                       (unsigned long long)lo, (unsigned long long)hi);
    return 0;
}

int synth_validate(const synth_params *p, ditto_err *err) {
    if (check_range("layers", p->n_layers, 1, 4096, err) || check_range("hidden", p->hidden, 1, 1u << 20, err) ||
        check_range("heads", p->n_heads, 1, 1u << 16, err) ||
        check_range("kv-heads", p->n_kv_heads, 1, p->n_heads, err) ||
        check_range("head-dim", p->head_dim, 1, 1u << 16, err) ||
        check_range("experts", p->n_experts, 0, 1u << 16, err) ||
        check_range("dense-ffn", p->dense_ffn, 1, 1u << 20, err) ||
        check_range("vocab", p->vocab, 1, 1u << 24, err) || check_range("ctx", p->ctx, 1, 1u << 30, err))
        return -1;
    if (p->n_heads % p->n_kv_heads)
        return err_set(err, "synth: heads = %u is not a multiple of kv-heads = %u", p->n_heads, p->n_kv_heads);
    if (p->n_experts > 0 && (check_range("experts-used", p->n_experts_used, 1, p->n_experts, err) ||
                             check_range("expert-ffn", p->expert_ffn, 1, 1u << 20, err)))
        return -1;
    if ((uint64_t)p->n_heads * p->head_dim > (1u << 20))
        return err_set(err, "synth: heads x head-dim = %llu is too large",
                       (unsigned long long)p->n_heads * p->head_dim);
    if (p->type != SYNTH_Q4_K_M && p->type != SYNTH_Q4_0 && p->type != SYNTH_Q8_0 && p->type != SYNTH_Q5_K_M)
        return err_set(err, "synth: unknown type %d", (int)p->type);
    return 0;
}

uint32_t synth_fit_type(uint32_t want, uint64_t row_len) {
    const quant_traits *tr = quant_traits_of(want);
    DT_ASSERT(tr != NULL);
    if (row_len % tr->blck == 0) return want;
    if (row_len % QK32 == 0) return QT_Q8_0;
    return QT_F32;
}

/* ---- random generation ------------------------------------------------------------------- */

static inline uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static void fill_random(uint64_t *state, uint8_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t r = splitmix64(state);
        memcpy(dst + i, &r, 8);
    }
    if (i < n) {
        uint64_t r = splitmix64(state);
        memcpy(dst + i, &r, n - i);
    }
}

enum tensor_kind { TK_WEIGHT, TK_NORM, TK_ROUTER };

/* Per-tensor constants for rewriting block headers. */
typedef struct gen_ctx {
    uint32_t type;
    enum tensor_kind kind;
    float sigma;            /* target std of the dequantized weights */
    fp16_t d_jit[256];      /* Q4_0 / Q8_0: d by 8 random bits (7: jitter, 1: sign for Q4_0) */
    fp16_t d, dmin;         /* Q4_K / Q5_K / Q6_K */
    uint8_t k_m[32];        /* Q4_K / Q5_K: m for sc = 32 + i */
} gen_ctx;

static void gen_init(gen_ctx *g, uint32_t type, enum tensor_kind kind, uint64_t row_len) {
    memset(g, 0, sizeof *g);
    g->type = type;
    g->kind = kind;
    g->sigma = (float)(1.0 / sqrt((double)row_len));
    double base = 0;
    if (type == QT_Q8_0) base = g->sigma / 73.9;
    if (type == QT_Q4_0) base = g->sigma / 4.637; /* rms of q - 8 */
    if (base > 0) {
        /* factor uniform in [0.75, 1.25], normalised to rms 1 */
        double s2 = 0;
        for (int i = 0; i < 128; i++) s2 += (0.75 + 0.5 * i / 127.0) * (0.75 + 0.5 * i / 127.0);
        const double rms = sqrt(s2 / 128.0);
        for (int i = 0; i < 256; i++) {
            /* Q4_0's (q - 8) has mean -1/2: a random sign on d (as ggml's own
             * quantizer produces) makes the weights zero-mean */
            double sign = (type == QT_Q4_0 && i >= 128) ? -1.0 : 1.0;
            g->d_jit[i] = f32_to_fp16((float)(sign * base * (0.75 + 0.5 * (i & 127) / 127.0) / rms));
        }
    }
    if (type == QT_Q4_K) {
        /* E[sc^2] for sc uniform in 32..63 */
        double e_sc2 = 47.5 * 47.5 + (32.0 * 32.0 - 1.0) / 12.0;
        g->d = f32_to_fp16((float)(g->sigma / (4.61 * sqrt(e_sc2))));
        g->dmin = f32_to_fp16(8.0f * fp16_to_f32(g->d));
        for (int i = 0; i < 32; i++) g->k_m[i] = (uint8_t)(((32 + i) * 15 + 8) / 16);
    }
    if (type == QT_Q5_K) { /* q in 0..31 (rms of q - 15.5: 9.23); dmin * m ~ 15.5 d sc */
        double e_sc2 = 47.5 * 47.5 + (32.0 * 32.0 - 1.0) / 12.0;
        g->d = f32_to_fp16((float)(g->sigma / (9.23 * sqrt(e_sc2))));
        g->dmin = f32_to_fp16(16.0f * fp16_to_f32(g->d));
        for (int i = 0; i < 32; i++) g->k_m[i] = (uint8_t)(((32 + i) * 31 + 16) / 32);
    }
    if (type == QT_Q6_K) {
        double e_s2 = 95.5 * 95.5 + (64.0 * 64.0 - 1.0) / 12.0;
        g->d = f32_to_fp16((float)(g->sigma / (18.47 * sqrt(e_s2))));
    }
}

static void fix_q8_0(const gen_ctx *g, uint8_t *p, size_t nb) {
    for (size_t i = 0; i < nb; i++, p += sizeof(block_q8_0)) memcpy(p, &g->d_jit[p[0] & 127], 2);
}
static void fix_q4_0(const gen_ctx *g, uint8_t *p, size_t nb) {
    for (size_t i = 0; i < nb; i++, p += sizeof(block_q4_0)) memcpy(p, &g->d_jit[p[0]], 2);
}

/* Q4_K, or Q5_K (bs: the block size; d, dmin and scales sit alike in both). */
static void fix_q45_K(const gen_ctx *g, uint8_t *p, size_t nb, size_t bs) {
    for (size_t i = 0; i < nb; i++, p += bs) {
        block_q4_K *b = (block_q4_K *)p;
        uint8_t sc[8], m[8], *s = b->scales;
        for (int j = 0; j < 8; j++) {
            int r = s[j] & 31; /* random bits already in place */
            sc[j] = (uint8_t)(32 + r);
            m[j] = g->k_m[r];
        }
        for (int j = 0; j < 4; j++) {
            s[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
            s[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
            s[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
        }
        memcpy(&b->d, &g->d, 2);
        memcpy(&b->dmin, &g->dmin, 2);
    }
}

static void fix_q6_K(const gen_ctx *g, uint8_t *p, size_t nb) {
    for (size_t i = 0; i < nb; i++, p += sizeof(block_q6_K)) {
        block_q6_K *b = (block_q6_K *)p;
        for (int j = 0; j < QK_K / 16; j++) { /* |s| in 64..127, random sign: zero mean */
            uint8_t r = (uint8_t)b->scales[j];
            int s = 64 + (r & 63);
            b->scales[j] = (int8_t)(r & 64 ? -s : s);
        }
        memcpy(&b->d, &g->d, 2);
    }
}

static void fix_f32(const gen_ctx *g, uint8_t *p, size_t n) {
    size_t k = n / 4;
    if (g->kind == TK_NORM) {
        const float one = 1.0f;
        for (size_t i = 0; i < k; i++) memcpy(p + 4 * i, &one, 4);
        return;
    }
    /* uniform in [-a, a] with std sigma (router: 1/sqrt(hidden) as well) */
    const float a = g->sigma * 1.7320508f / 2147483648.0f;
    for (size_t i = 0; i < k; i++) {
        int32_t r;
        memcpy(&r, p + 4 * i, 4);
        float x = (float)r * a;
        memcpy(p + 4 * i, &x, 4);
    }
}

/* Rewrites a chunk of random bytes into well-formed data of g->type. */
static void gen_fix(const gen_ctx *g, uint8_t *p, size_t n) {
    switch (g->type) {
    case QT_Q8_0: fix_q8_0(g, p, n / sizeof(block_q8_0)); break;
    case QT_Q4_0: fix_q4_0(g, p, n / sizeof(block_q4_0)); break;
    case QT_Q4_K: fix_q45_K(g, p, n / sizeof(block_q4_K), sizeof(block_q4_K)); break;
    case QT_Q5_K: fix_q45_K(g, p, n / sizeof(block_q5_K), sizeof(block_q5_K)); break;
    case QT_Q6_K: fix_q6_K(g, p, n / sizeof(block_q6_K)); break;
    case QT_F32: fix_f32(g, p, n); break;
    default: DT_ASSERT(!"synth: unexpected type");
    }
}

/* ---- the tensor plan ---------------------------------------------------------------------- */

enum tensor_role { TR_EMBD, TR_OUTPUT, TR_ATTN, TR_ATTN_V, TR_FFN, TR_F32 };

typedef struct plan_t {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[3];
    uint32_t type;
    enum tensor_kind kind;
} plan_t;

typedef struct plan {
    plan_t *t;
    size_t n, cap;
} plan;

static uint32_t role_type(const synth_params *p, enum tensor_role role) {
    if (role == TR_F32) return QT_F32;
    if (p->type == SYNTH_Q8_0) return QT_Q8_0;
    if (role == TR_OUTPUT || (role == TR_EMBD && p->tie_output)) return QT_Q6_K;
    if (p->type == SYNTH_Q4_0) return QT_Q4_0;
    if (role == TR_EMBD || role == TR_ATTN_V) return QT_Q6_K;
    return p->type == SYNTH_Q5_K_M ? QT_Q5_K : QT_Q4_K;
}

static void plan_add(plan *pl, const synth_params *p, int layer, const char *name, enum tensor_role role,
                     enum tensor_kind kind, uint32_t n_dims, uint64_t ne0, uint64_t ne1, uint64_t ne2) {
    if (pl->n == pl->cap) {
        pl->cap = pl->cap ? 2 * pl->cap : 64;
        plan_t *t = realloc(pl->t, pl->cap * sizeof *t);
        DT_ASSERT(t != NULL);
        pl->t = t;
    }
    plan_t *t = &pl->t[pl->n++];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "blk.%d.%s.weight", layer, name);
    else
        snprintf(t->name, sizeof t->name, "%s.weight", name);
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    uint32_t want = role_type(p, role);
    t->type = synth_fit_type(want, ne0);
    t->kind = kind;
    if (t->type != want && layer <= 0 && !p->quiet)
        fprintf(stderr, "synth: note: %s%s.weight: row length %llu is not a multiple of the %s block size %u; "
                        "using %s\n",
                layer == 0 ? "blk.*." : "", name, (unsigned long long)ne0, quant_traits_of(want)->name,
                quant_traits_of(want)->blck, quant_traits_of(t->type)->name);
}

static void build_plan(plan *pl, const synth_params *p) {
    uint64_t h = p->hidden, q = (uint64_t)p->n_heads * p->head_dim, kv = (uint64_t)p->n_kv_heads * p->head_dim;
    plan_add(pl, p, -1, "token_embd", TR_EMBD, TK_WEIGHT, 2, h, p->vocab, 1);
    for (int l = 0; l < (int)p->n_layers; l++) {
        plan_add(pl, p, l, "attn_norm", TR_F32, TK_NORM, 1, h, 1, 1);
        plan_add(pl, p, l, "attn_q", TR_ATTN, TK_WEIGHT, 2, h, q, 1);
        plan_add(pl, p, l, "attn_k", TR_ATTN, TK_WEIGHT, 2, h, kv, 1);
        plan_add(pl, p, l, "attn_v", TR_ATTN_V, TK_WEIGHT, 2, h, kv, 1);
        plan_add(pl, p, l, "attn_output", TR_ATTN, TK_WEIGHT, 2, q, h, 1);
        plan_add(pl, p, l, "attn_q_norm", TR_F32, TK_NORM, 1, p->head_dim, 1, 1);
        plan_add(pl, p, l, "attn_k_norm", TR_F32, TK_NORM, 1, p->head_dim, 1, 1);
        plan_add(pl, p, l, "ffn_norm", TR_F32, TK_NORM, 1, h, 1, 1);
        if (p->n_experts > 0) {
            uint64_t e = p->n_experts, f = p->expert_ffn;
            plan_add(pl, p, l, "ffn_gate_inp", TR_F32, TK_ROUTER, 2, h, e, 1);
            plan_add(pl, p, l, "ffn_gate_exps", TR_FFN, TK_WEIGHT, 3, h, f, e);
            plan_add(pl, p, l, "ffn_up_exps", TR_FFN, TK_WEIGHT, 3, h, f, e);
            plan_add(pl, p, l, "ffn_down_exps", TR_FFN, TK_WEIGHT, 3, f, h, e);
        } else {
            uint64_t f = p->dense_ffn;
            plan_add(pl, p, l, "ffn_gate", TR_FFN, TK_WEIGHT, 2, h, f, 1);
            plan_add(pl, p, l, "ffn_up", TR_FFN, TK_WEIGHT, 2, h, f, 1);
            plan_add(pl, p, l, "ffn_down", TR_FFN, TK_WEIGHT, 2, f, h, 1);
        }
    }
    plan_add(pl, p, -1, "output_norm", TR_F32, TK_NORM, 1, h, 1, 1);
    if (!p->tie_output) plan_add(pl, p, -1, "output", TR_OUTPUT, TK_WEIGHT, 2, h, p->vocab, 1);
}

/* ---- metadata ------------------------------------------------------------------------------- */

static void arch_key(char *buf, size_t n, const char *arch, const char *suffix) {
    snprintf(buf, n, "%s.%s", arch, suffix);
}

static int add_metadata(gguf_writer *w, const synth_params *p, ditto_err *err) {
    const char *arch = p->n_experts > 0 ? "qwen3moe" : "qwen3";
    static const uint32_t file_type[] = {[SYNTH_Q4_K_M] = 15, [SYNTH_Q4_0] = 2, [SYNTH_Q8_0] = 7, [SYNTH_Q5_K_M] = 17};
    char k[128];
    gguf_write_set_str(w, "general.architecture", arch);
    gguf_write_set_str(w, "general.type", "model");
    gguf_write_set_str(w, "general.name", "ditto-synth");
    gguf_write_set_u32(w, "general.quantization_version", 2);
    gguf_write_set_u32(w, "general.file_type", file_type[p->type]);
    const struct { const char *suffix; uint32_t v; } u[] = {
        {"block_count", p->n_layers},
        {"context_length", p->ctx},
        {"embedding_length", p->hidden},
        {"feed_forward_length", p->dense_ffn},
        {"attention.head_count", p->n_heads},
        {"attention.head_count_kv", p->n_kv_heads},
        {"attention.key_length", p->head_dim},
        {"attention.value_length", p->head_dim},
    };
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++) {
        arch_key(k, sizeof k, arch, u[i].suffix);
        gguf_write_set_u32(w, k, u[i].v);
    }
    arch_key(k, sizeof k, arch, "rope.freq_base");
    gguf_write_set_f32(w, k, 1e6f);
    arch_key(k, sizeof k, arch, "attention.layer_norm_rms_epsilon");
    gguf_write_set_f32(w, k, 1e-6f);
    if (p->n_experts > 0) {
        arch_key(k, sizeof k, arch, "expert_count");
        gguf_write_set_u32(w, k, p->n_experts);
        arch_key(k, sizeof k, arch, "expert_used_count");
        gguf_write_set_u32(w, k, p->n_experts_used);
        arch_key(k, sizeof k, arch, "expert_feed_forward_length");
        gguf_write_set_u32(w, k, p->expert_ffn);
    }
    if (!p->tokenizer_from) return 0;
    gguf_file *src;
    if (gguf_open(&src, p->tokenizer_from, err)) return -1;
    const gguf_kv *tok = gguf_find_kv(src, "tokenizer.ggml.tokens");
    int rc = 0;
    if (!tok || tok->type != GGUF_VT_ARRAY || tok->arr_type != GGUF_VT_STRING)
        rc = err_set(err, "synth: %s has no tokenizer.ggml.tokens string array (--tokenizer-from)",
                     p->tokenizer_from);
    else if (tok->arr_n != p->vocab)
        rc = err_set(err,
                     "synth: vocab %u does not match the %llu tokens of the tokenizer in %s "
                     "(use --vocab %llu, or --tokenizer-from none for no tokenizer)",
                     p->vocab, (unsigned long long)tok->arr_n, p->tokenizer_from, (unsigned long long)tok->arr_n);
    else
        gguf_write_copy_kv(w, src, "tokenizer.");
    gguf_close(src);
    return rc;
}

/* ---- writing ------------------------------------------------------------------------------------ */

static void progress(const synth_params *p, bool tty, const gguf_writer *w, uint64_t total, const char *name,
                     double t0, double *last) {
    if (p->quiet || !tty) return;
    double now = time_now();
    if (now - *last < 0.25) return;
    *last = now;
    uint64_t done = gguf_write_bytes_written(w);
    fprintf(stderr, "\rsynth: %5.1f%%  %.2f / %.2f GiB  %.0f MB/s  %-32s", 100.0 * (double)done / (double)total,
            (double)done / (1u << 30), (double)total / (1u << 30), (double)done / 1e6 / DT_MAX(now - t0, 1e-9),
            name);
    fflush(stderr);
}

/* Fails early when the target file system clearly lacks the space. */
static int check_space(const char *path, uint64_t need, ditto_err *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)DT_MIN((size_t)(slash - path), sizeof dir - 1), path);
    struct statvfs st;
    if (statvfs(dir, &st) != 0) return 0; /* let the write report it */
    uint64_t avail = (uint64_t)st.f_bavail * st.f_frsize;
    struct stat fst; /* an existing file is truncated: its blocks count as free */
    if (stat(path, &fst) == 0 && S_ISREG(fst.st_mode)) avail += (uint64_t)fst.st_blocks * 512;
    if (avail < need)
        return err_set(err, "synth: %s needs %.2f GiB but only %.2f GiB are free in %s", path,
                       (double)need / (1u << 30), (double)avail / (1u << 30), dir);
    return 0;
}

static int write_tensors(gguf_writer *w, const plan *pl, const synth_params *p, uint8_t *buf, uint64_t total,
                         ditto_err *err) {
    bool tty = isatty(2);
    double t0 = time_now(), last = 0;
    for (size_t i = 0; i < pl->n; i++) {
        const plan_t *t = &pl->t[i];
        const quant_traits *tr = quant_traits_of(t->type);
        gen_ctx g;
        gen_init(&g, t->type, t->kind, t->ne[0]);
        uint64_t state = p->seed ^ fnv1a(t->name);
        (void)splitmix64(&state);
        /* a whole number of 8-block groups per chunk: a multiple of 8 bytes, so the
         * random stream does not depend on where chunks split */
        size_t group = (size_t)tr->bytes * 8;
        size_t chunk = SYNTH_CHUNK / group * group;
        uint64_t left = gguf_write_tensor_nbytes(w, i);
        while (left > 0) {
            size_t n = (size_t)DT_MIN(left, (uint64_t)chunk);
            fill_random(&state, buf, n);
            gen_fix(&g, buf, n);
            if (gguf_write_data(w, buf, n, err)) return -1;
            left -= n;
            progress(p, tty, w, total, t->name, t0, &last);
        }
    }
    if (!p->quiet && tty) fprintf(stderr, "\r%*s\r", 100, "");
    return 0;
}

int synth_write(const synth_params *p, const char *path, ditto_err *err) {
    if (synth_validate(p, err)) return -1;
    double t0 = time_now();
    gguf_writer *w = gguf_write_new();
    plan pl = {0};
    int rc = add_metadata(w, p, err);
    if (rc == 0) {
        build_plan(&pl, p);
        for (size_t i = 0; i < pl.n; i++) {
            const plan_t *t = &pl.t[i];
            gguf_write_add_tensor(w, t->name, t->n_dims, t->ne, t->type);
        }
    }
    uint64_t total = gguf_write_total_size(w);
    if (rc == 0) rc = check_space(path, total, err);
    bool begun = false; /* only a file this call created/truncated is removed on failure */
    if (rc == 0) {
        rc = gguf_write_begin(w, path, err);
        begun = rc == 0;
    }
    if (rc == 0) {
        uint8_t *buf = xaligned(SYNTH_CHUNK);
        rc = write_tensors(w, &pl, p, buf, total, err);
        free(buf);
    }
    if (rc == 0) rc = gguf_write_finish(w, err);
    gguf_write_free(w);
    if (rc != 0 && begun) unlink(path);
    double dt = time_now() - t0;
    if (rc == 0 && !p->quiet)
        fprintf(stderr, "synth: wrote %s: %llu bytes (%.2f GiB), %zu tensors, in %.1f s (%.0f MB/s)\n", path,
                (unsigned long long)total, (double)total / (1u << 30), pl.n, dt, (double)total / 1e6 / DT_MAX(dt, 1e-9));
    free(pl.t);
    return rc;
}

/* ---- command line ----------------------------------------------------------------------------------- */

static void synth_usage(void) {
    fprintf(stderr,
            "usage: ditto synth -o FILE [--preset 30b-a3b|tiny] [--type q4_k_m|q5_k_m|q4_0|q8_0] [--seed S]\n"
            "                   [--layers N] [--hidden N] [--heads N] [--kv-heads N] [--head-dim N]\n"
            "                   [--experts N] [--experts-used N] [--expert-ffn N] [--dense-ffn N]\n"
            "                   [--vocab N] [--ctx N] [--tied|--untied] [--tokenizer-from GGUF|none] [--quiet]\n"
            "Writes a random-weight GGUF of the given geometry (default preset 30b-a3b).\n"
            "  --experts 0        dense qwen3 (ffn_gate/ffn_up/ffn_down of width --dense-ffn)\n"
            "  --tokenizer-from   copy tokenizer.* keys from this GGUF (default %s\n"
            "                     when vocab is %u; with another --vocab and no --tokenizer-from,\n"
            "                     no tokenizer keys are written)\n",
            SYNTH_DEFAULT_TOKENIZER, SYNTH_QWEN_VOCAB);
}

static int parse_u64(const char *flag, const char *s, uint64_t max, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max) goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "ditto synth: %s needs an integer 0..%llu (got '%s')\n", flag, (unsigned long long)max,
            s ? s : "");
    return -1;
}

int synth_cmd(int argc, char **argv) {
    synth_params p;
    const char *out = NULL, *preset = "30b-a3b", *tok = NULL;
    bool vocab_set = false;
    /* the preset first, so that the other flags override it wherever they are */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--preset") == 0) preset = argv[i + 1];
    if (synth_params_preset(&p, preset)) {
        fprintf(stderr, "ditto synth: unknown preset '%s' (30b-a3b, tiny)\n", preset);
        return 2;
    }
    static const struct { const char *flag; size_t off; } nums[] = {
        {"--layers", offsetof(synth_params, n_layers)},     {"--hidden", offsetof(synth_params, hidden)},
        {"--heads", offsetof(synth_params, n_heads)},       {"--kv-heads", offsetof(synth_params, n_kv_heads)},
        {"--head-dim", offsetof(synth_params, head_dim)},   {"--experts", offsetof(synth_params, n_experts)},
        {"--experts-used", offsetof(synth_params, n_experts_used)},
        {"--expert-ffn", offsetof(synth_params, expert_ffn)}, {"--dense-ffn", offsetof(synth_params, dense_ffn)},
        {"--vocab", offsetof(synth_params, vocab)},         {"--ctx", offsetof(synth_params, ctx)},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool num = false;
        for (size_t j = 0; j < sizeof nums / sizeof nums[0]; j++) {
            if (strcmp(a, nums[j].flag) != 0) continue;
            uint64_t x;
            if (parse_u64(a, v, UINT32_MAX, &x)) return 2;
            uint32_t x32 = (uint32_t)x;
            memcpy((char *)&p + nums[j].off, &x32, sizeof x32);
            if (strcmp(a, "--vocab") == 0) vocab_set = true;
            num = true;
            i++;
        }
        if (num) continue;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            synth_usage();
            return 0;
        } else if (strcmp(a, "--tied") == 0) {
            p.tie_output = true;
        } else if (strcmp(a, "--untied") == 0) {
            p.tie_output = false;
        } else if (strcmp(a, "--quiet") == 0) {
            p.quiet = true;
        } else if (!v) {
            fprintf(stderr, "ditto synth: unknown option or missing value: %s\n", a);
            synth_usage();
            return 2;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            out = argv[++i];
        } else if (strcmp(a, "--preset") == 0) {
            i++;
        } else if (strcmp(a, "--tokenizer-from") == 0) {
            tok = argv[++i];
        } else if (strcmp(a, "--seed") == 0) {
            if (parse_u64(a, v, UINT64_MAX, &p.seed)) return 2;
            i++;
        } else if (strcmp(a, "--type") == 0) {
            i++;
            if (strcmp(v, "q4_k_m") == 0 || strcmp(v, "Q4_K_M") == 0)
                p.type = SYNTH_Q4_K_M;
            else if (strcmp(v, "q4_0") == 0 || strcmp(v, "Q4_0") == 0)
                p.type = SYNTH_Q4_0;
            else if (strcmp(v, "q8_0") == 0 || strcmp(v, "Q8_0") == 0)
                p.type = SYNTH_Q8_0;
            else if (strcmp(v, "q5_k_m") == 0 || strcmp(v, "Q5_K_M") == 0)
                p.type = SYNTH_Q5_K_M;
            else {
                fprintf(stderr, "ditto synth: unknown --type '%s' (q4_k_m, q5_k_m, q4_0, q8_0)\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "ditto synth: unknown option %s\n", a);
            synth_usage();
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "ditto synth: -o FILE is required\n");
        synth_usage();
        return 2;
    }
    if (tok && strcmp(tok, "none") == 0) {
        p.tokenizer_from = NULL;
    } else if (tok) {
        p.tokenizer_from = tok;
    } else if (vocab_set && p.vocab != SYNTH_QWEN_VOCAB) {
        p.tokenizer_from = NULL;
        if (!p.quiet)
            fprintf(stderr, "synth: note: --vocab %u is not the Qwen3 tokenizer's %u; writing no tokenizer keys\n",
                    p.vocab, SYNTH_QWEN_VOCAB);
    } else if (access(SYNTH_DEFAULT_TOKENIZER, R_OK) == 0) {
        p.tokenizer_from = SYNTH_DEFAULT_TOKENIZER;
    } else {
        fprintf(stderr,
                "ditto synth: the default tokenizer source %s was not found (relative to the current directory); "
                "pass --tokenizer-from GGUF, or --tokenizer-from none to write no tokenizer\n",
                SYNTH_DEFAULT_TOKENIZER);
        return 1;
    }
    ditto_err err = {{0}};
    if (synth_write(&p, out, &err)) {
        fprintf(stderr, "ditto synth: %s\n", err.msg);
        return 1;
    }
    return 0;
}
