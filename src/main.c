/* main.c — the ditto command line: info, run (and the subcommands of other modules). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "bench.h"
#include "engine.h"
#include "model.h"
#include "quant.h"
#include "sampler.h"
#include "synth.h"
#include "chat.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "models/tiny-qwen3moe-q4_k_m.gguf"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditto <command> [options]\n"
            "  serve [-m FILE] [--host H] [--port P] [--streams N] [--ctx N] [--threads N] [--max-queue N]\n"
            "        [--api-key KEY | --api-key-file F] [--unify]   OpenAI-compatible HTTP server\n"
            "  info -m FILE                      architecture, hyperparameters, tensor types, sizes\n"
            "  run  [-m FILE] (--prompt-ids 1,2,3 | -p TEXT | --chat MESSAGE [--think]) [-n N] [--threads T=NCPU]\n"
            "       [--logits-hash] [--dump-logits PATH]   greedy generation (ids, or text for -p/--chat)\n"
            "  tokenize [-m FILE] [--pieces] [--no-special] TEXT\n"
            "  bench -m FILE [--streams 1,6,16] [--prompt-len P] [--gen-len G] [--threads T=NCPU] [--unify] [--repeat R]\n"
            "       [--paired N [--trace] [--forms] [--ahead-ab B] [--place near|far]] [--ahead B] [--profile]   decode throughput vs the measured read bandwidth\n"
            "  synth -o FILE [--preset 30b-a3b|tiny] [geometry flags] [--type q4_k_m|q5_k_m|q4_0|q8_0]   random-weight model\n");
}

/* "1,2,3" -> ids (malloc'ed). */
static int parse_ids(const char *s, int32_t **ids, int *n) {
    int cap = 16;
    *ids = xmalloc(sizeof(int32_t) * (size_t)cap);
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "ditto: --prompt-ids: bad id at '%s'\n", s);
            return -1;
        }
        if (*n == cap) *ids = realloc(*ids, sizeof(int32_t) * (size_t)(cap *= 2));
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) {
            fprintf(stderr, "ditto: --prompt-ids: unexpected '%c'\n", *s);
            return -1;
        }
    }
    if (*n == 0) {
        fprintf(stderr, "ditto: --prompt-ids is empty\n");
        return -1;
    }
    return 0;
}

static int cmd_info(int argc, char **argv) {
    const char *path = DEFAULT_MODEL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) path = argv[++i];
        else {
            usage(stderr);
            return 2;
        }
    }
    model *m;
    ditto_err err;
    if (model_load(&m, path, &err)) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        return 1;
    }
    const model_hparams *hp = &m->hp;
    printf("file:          %s (%.1f MiB, GGUF v%u, %llu tensors)\n", path, (double)m->gguf->size / (1 << 20),
           m->gguf->version, (unsigned long long)m->gguf->n_tensors);
    printf("name:          %s\n", m->name ? m->name : "-");
    printf("architecture:  %s\n", hp->arch == MODEL_ARCH_QWEN3MOE ? "qwen3moe" : "qwen3");
    printf("layers:        %d\nhidden:        %d\nheads:         %d (kv %d, head dim %d)\n", hp->n_layer, hp->n_embd,
           hp->n_head, hp->n_head_kv, hp->head_dim);
    if (hp->arch == MODEL_ARCH_QWEN3MOE)
        printf("experts:       %d (%d used), expert ffn %d\n", hp->n_expert, hp->n_expert_used, hp->n_ff_exp);
    else
        printf("ffn:           %d\n", hp->n_ff);
    printf("vocab:         %d\ncontext:       %d\nrope base:     %g\nrms eps:       %g\noutput:        %s\n",
           hp->n_vocab, hp->n_ctx_train, hp->rope_base, hp->rms_eps, hp->tied_output ? "tied to token_embd" : "separate");
    printf("parameters:    %llu (%.2fB)\n", (unsigned long long)m->n_params, (double)m->n_params / 1e9);
    uint64_t count[QT_COUNT] = {0}, bytes[QT_COUNT] = {0};
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
        count[m->gguf->tensors[i].type]++;
        bytes[m->gguf->tensors[i].type] += m->gguf->tensors[i].nbytes;
    }
    printf("tensor types:\n");
    for (int t = 0; t < QT_COUNT; t++)
        if (count[t])
            printf("  %-6s %5llu tensors  %10.2f MiB\n", quant_traits_of((uint32_t)t)->name,
                   (unsigned long long)count[t], (double)bytes[t] / (1 << 20));
    uint64_t bpt = model_bytes_per_token(m);
    printf("bytes read per decoded token: %llu (%.2f MiB; weights only, KV extra)\n", (unsigned long long)bpt,
           (double)bpt / (1 << 20));
    model_free(m);
    return 0;
}

static int cmd_run(int argc, char **argv) {
    const char *path = DEFAULT_MODEL, *dump = NULL, *text = NULL, *chat = NULL;
    int32_t *prompt = NULL;
    int n_prompt = 0, n_gen = 16, threads = cli_default_threads(256);
    bool hash = false, think = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-m") && has) path = argv[++i];
        else if (!strcmp(a, "--prompt-ids") && has) {
            if (parse_ids(argv[++i], &prompt, &n_prompt)) return 2;
        } else if (!strcmp(a, "-n") && has) {
            if (cli_int("run", "-n", argv[++i], 0, 1 << 24, &n_gen)) return 2;
        } else if (!strcmp(a, "--threads") && has) {
            if (cli_int("run", "--threads", argv[++i], 1, 256, &threads)) return 2;
        } else if (!strcmp(a, "-p") && has) text = argv[++i];
        else if (!strcmp(a, "--chat") && has) chat = argv[++i];
        else if (!strcmp(a, "--think")) think = true;
        else if (!strcmp(a, "--logits-hash")) hash = true;
        else if (!strcmp(a, "--dump-logits") && has) dump = argv[++i];
        else {
            fprintf(stderr, "ditto run: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prompt == !(text || chat) || (text && chat)) {
        fprintf(stderr, "ditto run: give exactly one of --prompt-ids, -p TEXT, --chat MESSAGE\n");
        free(prompt);
        return 2;
    }
    model *m;
    ditto_err err;
    if (model_load(&m, path, &err)) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        free(prompt);
        return 1;
    }
    tokenizer *tok = NULL;
    detok_stream ds;
    if (text || chat) {
        if (tokenizer_load(&tok, m->gguf, &err)) {
            fprintf(stderr, "ditto: %s\n", err.msg);
            model_free(m);
            return 1;
        }
        if (tokenizer_chat_warning(tok)) fprintf(stderr, "ditto: %s\n", tokenizer_chat_warning(tok));
        char *rendered = NULL;
        if (chat) {
            chat_msg msg = {"user", chat, NULL};
            rendered = chat_render(tok, &msg, 1, true, think);
        }
        const char *src = chat ? rendered : text;
        size_t n_ids = 0;
        int rc = tokenizer_encode(tok, src, strlen(src), chat != NULL, &prompt, &n_ids, &err);
        free(rendered);
        if (rc || n_ids == 0) {
            fprintf(stderr, "ditto: %s\n", rc ? err.msg : "the prompt encodes to no tokens");
            tokenizer_free(tok);
            model_free(m);
            free(prompt);
            return 1;
        }
        n_prompt = (int)n_ids;
        detok_stream_init(&ds, tok);
    }
    engine_opts o;
    engine_opts_default(&o);
    o.n_threads = threads;
    o.ctx = n_prompt + n_gen;
    engine *e;
    if (engine_create(&e, m, &o, &err)) {
        fprintf(stderr, "ditto: %s\n", err.msg);
        model_free(m);
        return 1;
    }
    int slot = kv_slot_acquire(e->kv);
    int V = m->hp.n_vocab, rc = 0;
    double t0 = time_now(), t_first = 0;
    int32_t btok[64], pos[64], sl[64];
    uint8_t want[64];
    /* prefill in chunks; the last prompt row gives the first logits */
    int done = 0, cur = -1;
    while (done < n_prompt) {
        int n = DT_MIN(o.max_rows, n_prompt - done);
        for (int r = 0; r < n; r++) {
            btok[r] = prompt[done + r];
            pos[r] = done + r;
            sl[r] = slot;
            want[r] = done + r == n_prompt - 1;
        }
        engine_batch b = {n, btok, pos, sl, want};
        if (engine_forward(e, &b, &err) < 0) {
            fprintf(stderr, "ditto: %s\n", err.msg);
            rc = 1;
            goto out;
        }
        done += n;
    }
    t_first = time_now();
    for (int step = 0; step < n_gen; step++) {
        if (hash) fprintf(stderr, "step %d logits %016llx\n", step, (unsigned long long)engine_hash_floats(e->logits, (size_t)V));
        if (step == 0 && dump) {
            FILE *f = fopen(dump, "wb");
            if (!f || fwrite(e->logits, sizeof(float), (size_t)V, f) != (size_t)V) {
                fprintf(stderr, "ditto: cannot write %s\n", dump);
                rc = 1;
            }
            if (f) fclose(f);
        }
        cur = sampler_argmax(e->logits, V);
        if (tok) {
            if (tokenizer_is_eog(tok, cur)) break;
            if (cur < tokenizer_n_vocab(tok)) { /* a model row past the tokenizer's list (padding): no text */
                size_t len;
                const char *piece = detok_stream_push(&ds, cur, &len);
                fwrite(piece, 1, len, stdout);
            }
        } else {
            printf("%d%s", cur, step + 1 < n_gen ? " " : "\n");
        }
        fflush(stdout);
        if (step + 1 == n_gen) break;
        btok[0] = cur;
        pos[0] = n_prompt + step;
        sl[0] = slot;
        want[0] = 1;
        engine_batch b = {1, btok, pos, sl, want};
        if (engine_forward(e, &b, &err) < 0) {
            fprintf(stderr, "ditto: %s\n", err.msg);
            rc = 1;
            goto out;
        }
    }
    if (tok) {
        size_t len;
        const char *rest = detok_stream_flush(&ds, &len);
        fwrite(rest, 1, len, stdout);
        printf("\n");
    }
    double t1 = time_now();
    fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tok/s); decode: %d tokens in %.3f s (%.1f tok/s) [%s]\n",
            n_prompt, t_first - t0, n_prompt / (t_first - t0), n_gen > 1 ? n_gen - 1 : 0, t1 - t_first,
            n_gen > 1 ? (n_gen - 1) / (t1 - t_first) : 0.0, e->be->describe(e->be_state));
out:
    if (tok) {
        detok_stream_free(&ds);
        tokenizer_free(tok);
    }
    engine_free(e);
    model_free(m);
    free(prompt);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "serve")) return api_serve_cmd(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth")) return synth_cmd(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return bench_cmd(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return tokenizer_cmd(argc - 1, argv + 1);
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ditto: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
