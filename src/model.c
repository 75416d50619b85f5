/* model.c — loads qwen3moe / qwen3 hyperparameters and weights from GGUF. */
#include "model.h"

#include <string.h>
#include <unistd.h>

#include "quant.h"

static int get_u32(const gguf_file *f, const char *arch, const char *key, int *out, bool required,
                   int dflt, ditto_err *err) {
    char full[160];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    if (!gguf_find_kv(f, full)) {
        if (required) return err_set(err, "%s: missing metadata key '%s'", f->path, full);
        *out = dflt;
        return 0;
    }
    uint32_t v;
    if (gguf_get_u32(f, full, &v, err)) return -1;
    if (v > (1u << 30)) return err_set(err, "%s: metadata '%s' = %u is out of range", f->path, full, v);
    *out = (int)v;
    return 0;
}

/* Checks a tensor's type and shape: ne = {cols, rows, n_mat} (0 = don't care for n_mat==1). */
static int bind_weight(const gguf_file *f, const char *name, int cols, int rows, int n_mat, model_weight *w,
                       ditto_err *err) {
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t) return err_set(err, "%s: missing tensor '%s'", f->path, name);
    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr || !tr->supported)
        return err_set(err, "%s: tensor '%s' has type %s, which ditto cannot compute", f->path, name,
                       tr ? tr->name : "unknown");
    uint64_t want[4] = {(uint64_t)cols, (uint64_t)rows, (uint64_t)n_mat, 1};
    for (int d = 0; d < 4; d++)
        if (t->ne[d] != want[d])
            return err_set(err,
                           "%s: tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%d, %d, %d, 1] from "
                           "the metadata",
                           f->path, name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                           (unsigned long long)t->ne[2], (unsigned long long)t->ne[3], cols, rows, n_mat);
    if (tr->act == QA_Q8_32 && cols % QK32)
        return err_set(err, "%s: tensor '%s' row length %d is not a multiple of 32", f->path, name, cols);
    if (tr->act == QA_Q8_256 && cols % QK_K)
        return err_set(err, "%s: tensor '%s' row length %d is not a multiple of 256", f->path, name, cols);
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->n_mat = n_mat;
    w->row_bytes = quant_row_bytes(t->type, cols);
    w->mat_bytes = w->row_bytes * (size_t)rows;
    return 0;
}

/* A 1-D norm weight, dequantized into an owned float array. */
static int bind_vec(const gguf_file *f, const char *name, int n, float **out, ditto_err *err) {
    model_weight w;
    if (bind_weight(f, name, n, 1, 1, &w, err)) return -1;
    *out = xmalloc((size_t)n * sizeof(float));
    quant_traits_of(w.type)->dequant_row(w.data, *out, n);
    return 0;
}

static uint64_t weight_params(const model_weight *w) { return (uint64_t)w->cols * w->rows * w->n_mat; }

static int load_hparams(model *m, ditto_err *err) {
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    char *arch = NULL;
    if (gguf_get_str(f, "general.architecture", &arch, err)) return -1;
    if (strcmp(arch, "qwen3moe") == 0)
        hp->arch = MODEL_ARCH_QWEN3MOE;
    else if (strcmp(arch, "qwen3") == 0)
        hp->arch = MODEL_ARCH_QWEN3;
    else {
        err_set(err, "%s: general.architecture = '%s' (supported: qwen3moe, qwen3)", f->path, arch);
        free(arch);
        return -1;
    }
    int rc = get_u32(f, arch, "block_count", &hp->n_layer, true, 0, err) ||
             get_u32(f, arch, "embedding_length", &hp->n_embd, true, 0, err) ||
             get_u32(f, arch, "attention.head_count", &hp->n_head, true, 0, err) ||
             get_u32(f, arch, "attention.head_count_kv", &hp->n_head_kv, false, hp->n_head, err) ||
             get_u32(f, arch, "context_length", &hp->n_ctx_train, false, 4096, err) ||
             get_u32(f, arch, "feed_forward_length", &hp->n_ff, hp->arch == MODEL_ARCH_QWEN3, 0, err);
    if (!rc && hp->arch == MODEL_ARCH_QWEN3MOE)
        rc = get_u32(f, arch, "expert_count", &hp->n_expert, true, 0, err) ||
             get_u32(f, arch, "expert_used_count", &hp->n_expert_used, true, 0, err) ||
             get_u32(f, arch, "expert_feed_forward_length", &hp->n_ff_exp, true, 0, err);
    int vlen = 0;
    if (!rc && hp->n_head > 0)
        rc = get_u32(f, arch, "attention.key_length", &hp->head_dim, false, hp->n_embd / hp->n_head, err) ||
             get_u32(f, arch, "attention.value_length", &vlen, false, hp->head_dim, err);
    char key[160];
    if (!rc) {
        snprintf(key, sizeof key, "%s.rope.freq_base", arch);
        hp->rope_base = 10000.0f;
        if (gguf_find_kv(f, key)) rc = gguf_get_f32(f, key, &hp->rope_base, err);
    }
    if (!rc) {
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
        rc = gguf_get_f32(f, key, &hp->rms_eps, err);
    }
    free(arch);
    if (rc) return -1;
    if (hp->n_layer < 1 || hp->n_embd < 1 || hp->n_head < 1 || hp->n_head_kv < 1 || hp->head_dim < 2 ||
        hp->head_dim % 2)
        return err_set(err, "%s: invalid geometry: layers %d, hidden %d, heads %d, kv heads %d, head dim %d",
                       f->path, hp->n_layer, hp->n_embd, hp->n_head, hp->n_head_kv, hp->head_dim);
    if (hp->n_head % hp->n_head_kv)
        return err_set(err, "%s: head_count %d is not a multiple of head_count_kv %d", f->path, hp->n_head,
                       hp->n_head_kv);
    /* bounds before anything is sized by them: a layer holds several tensors, and the
     * attention widths are ints (far above any real model's, far below overflow) */
    if ((uint64_t)hp->n_layer > f->n_tensors)
        return err_set(err, "%s: block_count %d exceeds the file's %llu tensors", f->path, hp->n_layer,
                       (unsigned long long)f->n_tensors);
    if ((int64_t)hp->n_head * hp->head_dim > (1 << 24) || hp->n_embd > (1 << 24))
        return err_set(err, "%s: attention width head_count %d x key_length %d or embedding_length %d is too large",
                       f->path, hp->n_head, hp->head_dim, hp->n_embd);
    if (vlen != hp->head_dim)
        return err_set(err, "%s: attention.value_length %d differs from key_length %d (unsupported)", f->path,
                       vlen, hp->head_dim);
    if (hp->arch == MODEL_ARCH_QWEN3MOE &&
        (hp->n_expert < 1 || hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1))
        return err_set(err, "%s: invalid experts: count %d, used %d, ffn %d", f->path, hp->n_expert,
                       hp->n_expert_used, hp->n_ff_exp);
    if (hp->arch == MODEL_ARCH_QWEN3 && hp->n_ff < 1)
        return err_set(err, "%s: invalid feed_forward_length %d", f->path, hp->n_ff);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 0.0f))
        return err_set(err, "%s: invalid rms epsilon %g or rope base %g", f->path, hp->rms_eps, hp->rope_base);
    return 0;
}

static int load_weights(model *m, ditto_err *err) {
    const gguf_file *f = m->gguf;
    model_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(f, "token_embd.weight");
    if (!te) return err_set(err, "%s: missing tensor 'token_embd.weight'", f->path);
    if (te->ne[1] > (1u << 24)) return err_set(err, "%s: vocabulary size %llu too large", f->path,
                                              (unsigned long long)te->ne[1]);
    hp->n_vocab = (int)te->ne[1];
    int E = hp->n_embd, H = hp->n_head * hp->head_dim, HKV = hp->n_head_kv * hp->head_dim;
    if (bind_weight(f, "token_embd.weight", E, hp->n_vocab, 1, &m->tok_embd, err)) return -1;
    if (gguf_find_tensor(f, "output.weight")) {
        if (bind_weight(f, "output.weight", E, hp->n_vocab, 1, &m->output, err)) return -1;
    } else {
        m->output = m->tok_embd;
        hp->tied_output = true;
    }
    if (bind_vec(f, "output_norm.weight", E, &m->output_norm, err)) return -1;
    m->layers = xcalloc((size_t)hp->n_layer, sizeof(model_layer));
    m->n_params = weight_params(&m->tok_embd) + (hp->tied_output ? 0 : weight_params(&m->output)) + (uint64_t)E;
    for (int l = 0; l < hp->n_layer; l++) {
        model_layer *L = &m->layers[l];
        char n[GGUF_MAX_NAME];
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s.weight", l, s), n)
        if (bind_vec(f, NAME("attn_norm"), E, &L->attn_norm, err) ||
            bind_vec(f, NAME("attn_q_norm"), hp->head_dim, &L->q_norm, err) ||
            bind_vec(f, NAME("attn_k_norm"), hp->head_dim, &L->k_norm, err) ||
            bind_vec(f, NAME("ffn_norm"), E, &L->ffn_norm, err) ||
            bind_weight(f, NAME("attn_q"), E, H, 1, &L->wq, err) ||
            bind_weight(f, NAME("attn_k"), E, HKV, 1, &L->wk, err) ||
            bind_weight(f, NAME("attn_v"), E, HKV, 1, &L->wv, err) ||
            bind_weight(f, NAME("attn_output"), H, E, 1, &L->wo, err))
            return -1;
        m->n_params += (uint64_t)2 * E + 2 * (uint64_t)hp->head_dim + weight_params(&L->wq) +
                       weight_params(&L->wk) + weight_params(&L->wv) + weight_params(&L->wo);
        if (hp->arch == MODEL_ARCH_QWEN3MOE) {
            if (bind_weight(f, NAME("ffn_gate_inp"), E, hp->n_expert, 1, &L->gate_inp, err) ||
                bind_weight(f, NAME("ffn_gate_exps"), E, hp->n_ff_exp, hp->n_expert, &L->gate_exps, err) ||
                bind_weight(f, NAME("ffn_up_exps"), E, hp->n_ff_exp, hp->n_expert, &L->up_exps, err) ||
                bind_weight(f, NAME("ffn_down_exps"), hp->n_ff_exp, E, hp->n_expert, &L->down_exps, err))
                return -1;
            if (quant_traits_of(L->gate_exps.type)->act != quant_traits_of(L->up_exps.type)->act)
                return err_set(err, "%s: blk.%d ffn_gate_exps (%s) and ffn_up_exps (%s) need different activation "
                               "formats (unsupported mix)", f->path, l, quant_traits_of(L->gate_exps.type)->name,
                               quant_traits_of(L->up_exps.type)->name);
            m->n_params += weight_params(&L->gate_inp) + weight_params(&L->gate_exps) +
                           weight_params(&L->up_exps) + weight_params(&L->down_exps);
        } else {
            if (bind_weight(f, NAME("ffn_gate"), E, hp->n_ff, 1, &L->ffn_gate, err) ||
                bind_weight(f, NAME("ffn_up"), E, hp->n_ff, 1, &L->ffn_up, err) ||
                bind_weight(f, NAME("ffn_down"), hp->n_ff, E, 1, &L->ffn_down, err))
                return -1;
            m->n_params += weight_params(&L->ffn_gate) + weight_params(&L->ffn_up) + weight_params(&L->ffn_down);
        }
#undef NAME
    }
    return 0;
}

static void add_eog(model *m, int64_t id) {
    if (id < 0 || id >= m->hp.n_vocab || m->n_eog == 8) return;
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id) return;
    m->eog[m->n_eog++] = (int32_t)id;
}

/* End-of-generation ids from the tokenizer metadata (absent metadata: none). */
static void find_eog(model *m) {
    const gguf_file *f = m->gguf;
    const char *keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"};
    for (int i = 0; i < 2; i++) {
        uint32_t id;
        if (gguf_find_kv(f, keys[i]) && gguf_get_u32(f, keys[i], &id, NULL) == 0) add_eog(m, id);
    }
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!toks || toks->type != GGUF_VT_ARRAY || toks->arr_type != GGUF_VT_STRING) return;
    const char *names[] = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>"};
    for (uint64_t i = 0; i < toks->arr_n && i < (uint64_t)m->hp.n_vocab; i++) {
        uint64_t len;
        const char *t = gguf_arr_str(f, toks, i, &len);
        if (len < 5 || t[0] != '<' || t[1] != '|') continue;
        for (int k = 0; k < 3; k++)
            if (len == strlen(names[k]) && memcmp(t, names[k], len) == 0) add_eog(m, (int64_t)i);
    }
}

int model_load(model **out, const char *path, ditto_err *err) {
    *out = NULL;
    model *m = xcalloc(1, sizeof *m);
    if (gguf_open(&m->gguf, path, err)) {
        free(m);
        return -1;
    }
    if (load_hparams(m, err) || load_weights(m, err)) {
        model_free(m);
        return -1;
    }
    if (gguf_find_kv(m->gguf, "general.name")) gguf_get_str(m->gguf, "general.name", &m->name, NULL);
    find_eog(m);
    /* Fault the whole file in now, unless it is over half of RAM: then the CPU backend's
     * repack reads it slice by slice and drops each slice's file pages after use, which
     * leaves the memory free for its huge pages (populating it all first would fill RAM
     * with page cache that must be reclaimed and compacted again). */
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0 || m->gguf->size <= (uint64_t)pages * (uint64_t)psz / 2) gguf_populate(m->gguf);
    /* The embedding is read a few rows a step, at random. From the file mapping those rows' pages
     * can be evicted under memory pressure (the CPU backend drops the file's pages once it has
     * repacked them), and a page read back from disk costs milliseconds inside a step. An anonymous
     * copy stays resident (a tied output head keeps reading the file view, once, to repack it). */
    if (m->gguf->owns_map) {
        size_t bytes = m->tok_embd.mat_bytes;
        m->embd_copy = xmalloc(bytes); /* not xaligned: rows are read bytewise, and zeroing first would write it twice */
        memcpy(m->embd_copy, m->tok_embd.data, bytes);
        m->tok_embd.data = m->embd_copy;
    }
    *out = m;
    return 0;
}

void model_free(model *m) {
    if (!m) return;
    if (m->prepared_free) m->prepared_free(m->prepared);
    for (int l = 0; m->layers && l < m->hp.n_layer; l++) {
        free(m->layers[l].attn_norm);
        free(m->layers[l].q_norm);
        free(m->layers[l].k_norm);
        free(m->layers[l].ffn_norm);
    }
    free(m->layers);
    free(m->output_norm);
    free(m->embd_copy);
    free(m->name);
    gguf_close(m->gguf);
    free(m);
}

uint64_t model_bytes_per_token(const model *m) {
    const model_hparams *hp = &m->hp;
    uint64_t b = m->output.mat_bytes;
    for (int l = 0; l < hp->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        b += L->wq.mat_bytes + L->wk.mat_bytes + L->wv.mat_bytes + L->wo.mat_bytes;
        if (hp->arch == MODEL_ARCH_QWEN3MOE)
            b += L->gate_inp.mat_bytes +
                 (uint64_t)hp->n_expert_used * (L->gate_exps.mat_bytes + L->up_exps.mat_bytes + L->down_exps.mat_bytes);
        else
            b += L->ffn_gate.mat_bytes + L->ffn_up.mat_bytes + L->ffn_down.mat_bytes;
    }
    return b;
}

void model_embed(const model *m, int32_t id, float *x) {
    DT_ASSERT(id >= 0 && id < m->hp.n_vocab);
    const model_weight *w = &m->tok_embd;
    quant_traits_of(w->type)->dequant_row((const uint8_t *)w->data + (size_t)id * w->row_bytes, x, w->cols);
}
