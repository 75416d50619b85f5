/* bench_tokenizer.c — tokenizer throughput on the HF corpus (32,508 English documents).
 *
 * Build and run (from the repository root):
 *   make BUILD=build-tok build-tok/libditto.a
 *   cc -std=c11 -D_GNU_SOURCE -O2 -iquote src -o build-tok/bench_tokenizer bench/bench_tokenizer.c \
 *      build-tok/libditto.a -lpcre2-8 -lutf8proc -lm -pthread
 *   ./build-tok/bench_tokenizer [MODEL.gguf] [CORPUS.jsonl.gz] [REPS] [THREADS]
 * Defaults: ../shared/models/tiny-qwen3moe-q4_k_m.gguf, ../shared/tokenizer/hf-corpus-docs.jsonl.gz, 5, 1.
 *
 * Reports load time, then for encode (parse_special = true, one call per document, one
 * thread) and decode the best of REPS passes in MB/s of document text (UTF-8 bytes)
 * and in tokens/s; for encode also by thread CPU time (steadier on a busy machine) and
 * the first pass alone (the tokenizer's word cache starts empty). THREADS > 1 adds a
 * run with that many threads sharing one tokenizer (documents dealt round-robin). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "gguf.h"
#include "tokenizer.h"

/* CPU time of this thread: on a shared machine it leaves out time spent descheduled. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct doc {
    char *text;
    size_t len;
} doc;

/* The "text" member of one JSONL line, unescaped (\uXXXX incl. surrogate pairs). */
static char *json_text(const char *line, size_t *len) {
    const char *p = strstr(line, "\"text\": \"");
    if (!p) return NULL;
    p += 9;
    size_t cap = strlen(p) + 1, n = 0;
    char *o = xmalloc(cap);
    while (*p && *p != '"') {
        if (*p != '\\') {
            o[n++] = *p++;
            continue;
        }
        p++;
        char c = *p++;
        if (c == 'u') {
            unsigned cp = 0, lo = 0;
            if (sscanf(p, "%4x", &cp) != 1) break;
            p += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && p[0] == '\\' && p[1] == 'u' && sscanf(p + 2, "%4x", &lo) == 1) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            if (cp < 0x80) o[n++] = (char)cp;
            else if (cp < 0x800) o[n++] = (char)(0xc0 | cp >> 6), o[n++] = (char)(0x80 | (cp & 0x3f));
            else if (cp < 0x10000)
                o[n++] = (char)(0xe0 | cp >> 12), o[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)),
                o[n++] = (char)(0x80 | (cp & 0x3f));
            else
                o[n++] = (char)(0xf0 | cp >> 18), o[n++] = (char)(0x80 | ((cp >> 12) & 0x3f)),
                o[n++] = (char)(0x80 | ((cp >> 6) & 0x3f)), o[n++] = (char)(0x80 | (cp & 0x3f));
            continue;
        }
        o[n++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
    }
    o[n] = 0;
    *len = n;
    return o;
}

typedef struct job {
    const tokenizer *tok;
    const doc *docs;
    size_t n_docs, first, step;
    int failed;
} job;

static void *encode_job(void *p) {
    job *j = p;
    for (size_t i = j->first; i < j->n_docs; i += j->step) {
        int32_t *ids;
        size_t n;
        ditto_err err;
        if (tokenizer_encode(j->tok, j->docs[i].text, j->docs[i].len, true, &ids, &n, &err)) j->failed = 1;
        free(ids);
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "../shared/models/tiny-qwen3moe-q4_k_m.gguf";
    const char *corpus = argc > 2 ? argv[2] : "../shared/tokenizer/hf-corpus-docs.jsonl.gz";
    int reps = argc > 3 ? atoi(argv[3]) : 5;
    int threads = argc > 4 ? atoi(argv[4]) : 1;
    if (reps < 1) reps = 1;
    if (threads < 1 || threads > 256) threads = 1;

    char cmd[2048];
    snprintf(cmd, sizeof cmd, "gzip -dcf '%s'", corpus);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "cannot run %s\n", cmd);
        return 1;
    }
    size_t n_docs = 0, cap_docs = 1024, bytes = 0;
    doc *docs = xmalloc(cap_docs * sizeof *docs);
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        size_t len;
        char *t = json_text(line, &len);
        if (!t) continue;
        if (n_docs == cap_docs) {
            cap_docs *= 2;
            docs = realloc(docs, cap_docs * sizeof *docs);
            if (!docs) return 1;
        }
        docs[n_docs].text = t;
        docs[n_docs++].len = len;
        bytes += len;
    }
    free(line);
    pclose(f);
    if (!n_docs) {
        fprintf(stderr, "no documents read from %s\n", corpus);
        return 1;
    }

    ditto_err err;
    gguf_file *gf;
    tokenizer *tok;
    double t0 = time_now();
    if (gguf_open(&gf, model, &err) || tokenizer_load(&tok, gf, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double t_load = time_now() - t0;

    int32_t **ids = xcalloc(n_docs, sizeof *ids);
    size_t *n_ids = xcalloc(n_docs, sizeof *n_ids);
    size_t tokens = 0;
    double best_enc = 1e30, best_dec = 1e30, best_enc_cpu = 1e30, first_enc = 0;
    for (int r = 0; r < reps; r++) {
        tokens = 0;
        t0 = time_now();
        double c0 = cpu_now();
        for (size_t i = 0; i < n_docs; i++) {
            free(ids[i]);
            if (tokenizer_encode(tok, docs[i].text, docs[i].len, true, &ids[i], &n_ids[i], &err)) {
                fprintf(stderr, "encode: %s\n", err.msg);
                return 1;
            }
            tokens += n_ids[i];
        }
        double dt = time_now() - t0, dc = cpu_now() - c0;
        if (r == 0) first_enc = dt;
        if (dt < best_enc) best_enc = dt;
        if (dc < best_enc_cpu) best_enc_cpu = dc;
        t0 = time_now();
        for (size_t i = 0; i < n_docs; i++) {
            char *s;
            size_t l;
            if (tokenizer_decode(tok, ids[i], n_ids[i], &s, &l, &err)) return 1;
            free(s);
        }
        dt = time_now() - t0;
        if (dt < best_dec) best_dec = dt;
    }
    printf("corpus: %zu documents, %.2f MB of text, %zu tokens\n", n_docs, (double)bytes / 1e6, tokens);
    printf("load:   %.3f s (gguf_open + tokenizer_load)\n", t_load);
    printf("encode: %.1f MB/s, %.2f M tokens/s (best of %d: %.3f s wall; %.1f MB/s by thread CPU time; "
           "first pass, cold word cache: %.1f MB/s)\n",
           (double)bytes / best_enc / 1e6, (double)tokens / best_enc / 1e6, reps, best_enc,
           (double)bytes / best_enc_cpu / 1e6, (double)bytes / first_enc / 1e6);
    printf("decode: %.1f MB/s, %.2f M tokens/s (best of %d: %.3f s)\n", (double)bytes / best_dec / 1e6,
           (double)tokens / best_dec / 1e6, reps, best_dec);

    if (threads > 1) {
        pthread_t *th = xcalloc((size_t)threads, sizeof *th);
        job *jobs = xcalloc((size_t)threads, sizeof *jobs);
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            t0 = time_now();
            for (int k = 0; k < threads; k++) {
                jobs[k] = (job){tok, docs, n_docs, (size_t)k, (size_t)threads, 0};
                if (pthread_create(&th[k], NULL, encode_job, &jobs[k])) return 1;
            }
            for (int k = 0; k < threads; k++) {
                pthread_join(th[k], NULL);
                if (jobs[k].failed) return 1;
            }
            double dt = time_now() - t0;
            if (dt < best) best = dt;
        }
        printf("encode, %d threads: %.1f MB/s, %.2f M tokens/s (best of %d: %.3f s)\n", threads,
               (double)bytes / best / 1e6, (double)tokens / best / 1e6, reps, best);
        free(th);
        free(jobs);
    }

    for (size_t i = 0; i < n_docs; i++) {
        free(ids[i]);
        free(docs[i].text);
    }
    free(ids);
    free(n_ids);
    free(docs);
    tokenizer_free(tok);
    gguf_close(gf);
    return 0;
}
