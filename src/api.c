/* api.c — `ditto serve`: the command, boot and shutdown, routing, auth, errors, JSON
 * output helpers, /health /v1/models /metrics /slots. Generation requests: api_gen.c.
 *
 * A generation request's life (struct gen):
 *   connection thread: parse + validate + tokenize -> sched_submit -> registry ->
 *   hang-up watch -> either block reading tokens (non-streaming) or hand MHD a
 *   producer that blocks reading tokens (SSE) -> gen_end: unwatch, cancel if not
 *   finished, wait for the scheduler's final callback (the slot is free by then),
 *   count, release.
 *   step thread: on_token (counts tokens; computes logprobs from the step's logits).
 *   watcher thread: on_hangup (cancels the stream the moment the client goes).
 * Text: ids -> streaming detokenizer (whole UTF-8 characters only) -> stop-string
 * matcher (holds back any tail that could start a stop string) -> client. */
#include "api.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "api_internal.h"

/* ---- small helpers ------------------------------------------------------------- */

int api_fail(apierr *E, int status, enum met_reject why, const char *code, const char *param, const char *fmt, ...) {
    E->status = status;
    E->why = why;
    E->code = code;
    snprintf(E->param, sizeof E->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(E->msg, sizeof E->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t api_random(api *A) { return splitmix(A->id_salt ^ splitmix(atomic_fetch_add(&A->next_id, 1))); }

static const char *err_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 429: return "rate_limit_error";
    case 500:
    case 503: return "server_error";
    default: return "invalid_request_error";
    }
}

static void reply(api *A, http_req *r, int status, const char *ctype, const char *body, size_t len,
                  const char *const *hdrs) {
    metrics_status(A->met, status);
    http_respond(r, status, ctype, body, len, hdrs);
}

static void reply_json(api *A, http_req *r, int status, const http_buf *b) {
    reply(A, r, status, "application/json", b->p ? b->p : "", b->n, NULL);
}

static void send_error(api *A, http_req *r, enum met_endpoint ep, const apierr *E) {
    http_buf b = {0};
    hbuf_puts(&b, "{\"error\":{\"message\":");
    jstr_c(&b, E->msg);
    hbuf_puts(&b, ",\"type\":");
    jstr_c(&b, err_type(E->status));
    hbuf_puts(&b, ",\"param\":");
    if (E->param[0]) jstr_c(&b, E->param);
    else hbuf_puts(&b, "null");
    hbuf_puts(&b, ",\"code\":");
    if (E->code) jstr_c(&b, E->code);
    else hbuf_puts(&b, "null");
    hbuf_puts(&b, "}}");
    const char *hdrs[8];
    int k = 0;
    if (E->status == 429 || E->status == 503) {
        hdrs[k++] = "Retry-After";
        hdrs[k++] = "1";
    }
    if (E->status == 401) {
        hdrs[k++] = "WWW-Authenticate";
        hdrs[k++] = "Bearer";
    }
    if (E->status == 405 && E->allow) {
        hdrs[k++] = "Allow";
        hdrs[k++] = E->allow;
    }
    hdrs[k] = NULL;
    metrics_reject(A->met, E->why);
    metrics_request(A->met, ep, MET_OUT_REJECTED, 0, 0, 0);
    reply(A, r, E->status, "application/json", b.p, b.n, hdrs);
    hbuf_free(&b);
}

/* ---- JSON output ----------------------------------------------------------------- */

/* Length of the valid UTF-8 character at s (n bytes available), 0 if invalid. */
size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t k;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) k = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < k || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return k;
}

bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char_len((const unsigned char *)s + i, n - i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* A JSON string: escapes quotes, backslashes and control bytes; invalid UTF-8 becomes U+FFFD. */
void jstr(http_buf *b, const char *s, size_t n) {
    hbuf_add(b, "\"", 1);
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = 1;
        const char *esc = NULL;
        char tmp[8];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80) {
            k = utf8_char_len((const unsigned char *)s + i, n - i);
            if (!k) {
                esc = "\xEF\xBF\xBD";
                k = 1;
            }
        }
        if (esc) {
            hbuf_add(b, s + run, i - run);
            hbuf_puts(b, esc);
            i += k;
            run = i;
        } else
            i += k;
    }
    hbuf_add(b, s + run, i - run);
    hbuf_add(b, "\"", 1);
}

void jstr_c(http_buf *b, const char *s) { jstr(b, s, strlen(s)); }

void jnum(http_buf *b, double v) {
    if (!isfinite(v)) v = v > 0 ? 3.4e38 : -9999.0; /* OpenAI's stand-in for -inf logprobs */
    hbuf_printf(b, "%.9g", v);
}

/* ---- health, models, metrics, slots ------------------------------------------------ */

static void do_health(api *A, http_req *r) {
    int ph = atomic_load(&A->phase);
    http_buf b = {0};
    hbuf_printf(&b, "{\"status\":\"%s\"}", ph == PH_READY ? "ok" : ph == PH_LOADING ? "loading" : "shutting_down");
    reply_json(A, r, ph == PH_READY ? 200 : 503, &b);
    metrics_request(A->met, MET_EP_HEALTH, MET_OUT_OK, 0, 0, 0);
    hbuf_free(&b);
}

static void model_object(api *A, http_buf *b) {
    hbuf_puts(b, "{\"id\":");
    jstr_c(b, A->model_id);
    hbuf_printf(b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"ditto\",\"meta\":{\"n_ctx\":%d,"
                   "\"n_ctx_train\":%d,\"n_vocab\":%d,\"n_params\":%llu,\"slots\":%d}}",
                A->created, A->ctx, A->m->hp.n_ctx_train, A->n_vocab, (unsigned long long)A->m->n_params,
                A->o.streams);
}

static void do_models(api *A, http_req *r, const char *path) {
    apierr E = {0};
    if (atomic_load(&A->phase) == PH_LOADING) {
        api_fail(&E, 503, MET_REJ_LOADING, "model_loading", NULL, "the model is still loading");
        send_error(A, r, MET_EP_MODELS, &E);
        return;
    }
    http_buf b = {0};
    if (!strcmp(path, "/v1/models")) {
        hbuf_puts(&b, "{\"object\":\"list\",\"data\":[");
        model_object(A, &b);
        hbuf_puts(&b, "]}");
    } else {
        const char *id = path + strlen("/v1/models/");
        if (strcmp(id, A->model_id)) {
            api_fail(&E, 404, MET_REJ_NOT_FOUND, "model_not_found", "model", "The model '%s' does not exist", id);
            send_error(A, r, MET_EP_MODELS, &E);
            return;
        }
        model_object(A, &b);
    }
    reply_json(A, r, 200, &b);
    metrics_request(A->met, MET_EP_MODELS, MET_OUT_OK, 0, 0, 0);
    hbuf_free(&b);
}

static void do_metrics(api *A, http_req *r) {
    http_buf b = {0};
    bool loading = atomic_load(&A->phase) == PH_LOADING;
    sched_stats ss;
    if (!loading) sched_get_stats(A->s, &ss);
    pthread_mutex_lock(&A->reg_mu);
    int inflight = A->n_reg;
    pthread_mutex_unlock(&A->reg_mu);
    metrics_request(A->met, MET_EP_METRICS, MET_OUT_OK, 0, 0, 0);
    metrics_render(A->met, &b, loading ? NULL : &ss, A->o.streams, inflight, loading);
    reply(A, r, 200, "text/plain; version=0.0.4; charset=utf-8", b.p, b.n, NULL);
    hbuf_free(&b);
}

static void do_slots(api *A, http_req *r) {
    if (atomic_load(&A->phase) == PH_LOADING) {
        apierr E = {0};
        api_fail(&E, 503, MET_REJ_LOADING, "model_loading", NULL, "the model is still loading");
        send_error(A, r, MET_EP_SLOTS, &E);
        return;
    }
    int S = A->o.streams;
    gen **by_slot = xcalloc((size_t)S, sizeof *by_slot);
    enum sched_state *state = xcalloc((size_t)S, sizeof *state);
    http_buf q = {0}, b = {0};
    int n_queued = 0, n_busy = 0;
    pthread_mutex_lock(&A->reg_mu);
    for (gen *g = A->reg; g; g = g->next) {
        int slot = sched_stream_slot(A->s, g->st);
        int n;
        enum sched_state st = sched_stream_read(A->s, g->st, NULL, 0, &n, 0);
        if (st == SCHED_DONE) continue;
        if (slot >= 0 && slot < S) {
            by_slot[slot] = g;
            state[slot] = st;
            n_busy++;
        } else if (st == SCHED_QUEUED) {
            hbuf_puts(&q, n_queued++ ? "," : "");
            hbuf_printf(&q, "{\"stream_id\":%llu,\"request_id\":", (unsigned long long)sched_stream_id(g->st));
            jstr_c(&q, g->id);
            hbuf_printf(&q, ",\"prompt_tokens\":%d,\"max_tokens\":%d}", g->n_prompt, g->max_tokens);
        }
    }
    hbuf_puts(&b, "{\"slots\":[");
    for (int i = 0; i < S; i++) {
        gen *g = by_slot[i];
        hbuf_printf(&b, "%s{\"id\":%d,\"state\":", i ? "," : "", i);
        if (!g) {
            hbuf_puts(&b, "\"free\"}");
            continue;
        }
        hbuf_printf(&b, "\"%s\",\"stream_id\":%llu,\"request_id\":", state[i] == SCHED_PREFILL ? "prefill" : "decode",
                    (unsigned long long)sched_stream_id(g->st));
        jstr_c(&b, g->id);
        hbuf_printf(&b, ",\"endpoint\":\"%s\",\"prompt_tokens\":%d,\"tokens\":%d,\"max_tokens\":%d}",
                    g->ep == MET_EP_CHAT ? "chat" : "completions", g->n_prompt, atomic_load(&g->n_seen),
                    g->max_tokens);
    }
    pthread_mutex_unlock(&A->reg_mu);
    hbuf_printf(&b, "],\"queued\":[%s],\"slots_total\":%d,\"slots_free\":%d,\"queue_depth\":%d}", q.p ? q.p : "", S,
                S - n_busy, n_queued);
    reply_json(A, r, 200, &b);
    metrics_request(A->met, MET_EP_SLOTS, MET_OUT_OK, 0, 0, 0);
    hbuf_free(&b);
    hbuf_free(&q);
    free(by_slot);
    free(state);
}

/* ---- routing ------------------------------------------------------------------------ */

/* Constant-time in the key's content: the time depends on the configured key's length only. */
static bool auth_ok(const api *A, http_req *r) {
    const char *key = A->o.api_key;
    if (!key) return true;
    const char *h = http_req_header(r, "Authorization");
    if (!h) return false;
    while (*h == ' ') h++;
    if (strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    size_t a = strlen(h), b = strlen(key);
    while (a > 0 && h[a - 1] == ' ') a--;
    volatile unsigned char d = (unsigned char)(a != b);
    for (size_t i = 0; i < b; i++) d |= (unsigned char)((unsigned char)key[i] ^ (i < a ? (unsigned char)h[i] : 0));
    return d == 0;
}

static void handle(void *user, http_req *r) {
    api *A = user;
    const char *path = http_req_path(r), *method = http_req_method(r);
    bool is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), is_post = !strcmp(method, "POST");
    enum met_endpoint ep;
    bool post_route = false, public_route = false;
    apierr E = {0};
    if (!strcmp(path, "/v1/chat/completions")) ep = MET_EP_CHAT, post_route = true;
    else if (!strcmp(path, "/v1/completions")) ep = MET_EP_COMPLETIONS, post_route = true;
    else if (!strcmp(path, "/v1/models") || (!strncmp(path, "/v1/models/", 11) && path[11])) ep = MET_EP_MODELS;
    else if (!strcmp(path, "/health")) ep = MET_EP_HEALTH, public_route = true;
    else if (!strcmp(path, "/metrics")) ep = MET_EP_METRICS;
    else if (!strcmp(path, "/slots")) ep = MET_EP_SLOTS;
    else {
        api_fail(&E, 404, MET_REJ_NOT_FOUND, "not_found", NULL, "Unknown route: %s %s", method, path);
        send_error(A, r, MET_EP_OTHER, &E);
        return;
    }
    if (post_route ? !is_post : !is_get) {
        api_fail(&E, 405, MET_REJ_METHOD, "method_not_allowed", NULL, "Method %s is not allowed on %s (use %s)", method,
                 path, post_route ? "POST" : "GET");
        E.allow = post_route ? "POST" : "GET, HEAD";
        send_error(A, r, ep, &E);
        return;
    }
    if (!public_route && !auth_ok(A, r)) {
        api_fail(&E, 401, MET_REJ_UNAUTHORIZED, "invalid_api_key", NULL,
                 http_req_header(r, "Authorization") ? "Incorrect API key provided"
                                                     : "Missing API key: send 'Authorization: Bearer KEY'");
        send_error(A, r, ep, &E);
        return;
    }
    if (http_req_too_large(r)) {
        api_fail(&E, 413, MET_REJ_TOO_LARGE, "request_too_large", NULL, "Request body exceeds the limit of %zu bytes",
                 (size_t)API_MAX_BODY);
        send_error(A, r, ep, &E);
        return;
    }
    switch (ep) {
    case MET_EP_CHAT:
    case MET_EP_COMPLETIONS: api_generate(A, r, ep); break;
    case MET_EP_MODELS: do_models(A, r, path); break;
    case MET_EP_HEALTH: do_health(A, r); break;
    case MET_EP_METRICS: do_metrics(A, r); break;
    case MET_EP_SLOTS: do_slots(A, r); break;
    default: break;
    }
}

void api_send_error(api *A, http_req *r, enum met_endpoint ep, const apierr *E) { send_error(A, r, ep, E); }
void api_reply(api *A, http_req *r, int status, const char *ctype, const char *body, size_t len,
               const char *const *hdrs) {
    reply(A, r, status, ctype, body, len, hdrs);
}

/* ---- the serve command ------------------------------------------------------------------ */

static void usage(FILE *f) {
    fprintf(f,
            "usage: ditto serve [-m FILE] [--host 127.0.0.1] [--port 8080] [--streams 8] [--ctx 4096]\n"
            "                   [--threads NCPU] [--max-queue 64] [--prefill-chunk 64] [--unify]\n"
            "                   [--api-key KEY | --api-key-file FILE] [--grace SECONDS] [--quiet]\n"
            "  OpenAI-compatible HTTP API: POST /v1/chat/completions, POST /v1/completions,\n"
            "  GET /v1/models, /health, /metrics, /slots.  --port 0 picks a free port.\n");
}

static char *read_key_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ditto serve: --api-key-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    buf[strcspn(buf, "\r\n")] = 0;
    size_t a = 0, b = strlen(buf);
    while (a < b && (buf[a] == ' ' || buf[a] == '\t')) a++;
    while (b > a && (buf[b - 1] == ' ' || buf[b - 1] == '\t')) b--;
    if (a == b) {
        fprintf(stderr, "ditto serve: --api-key-file %s: the first line is empty\n", path);
        return NULL;
    }
    char *k = xmalloc(b - a + 1);
    memcpy(k, buf + a, b - a);
    k[b - a] = 0;
    return k;
}

static int parse_args(int argc, char **argv, serve_opts *o) {
    o->model_path = DEFAULT_MODEL;
    o->host = "127.0.0.1";
    o->port = 8080;
    o->streams = 8;
    o->ctx = 4096;
    o->threads = cli_default_threads(256);
    o->max_queue = 64;
    o->prefill_chunk = 64;
    o->grace = 5.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--unify")) o->unify = true;
        else if (!strcmp(a, "--quiet")) o->quiet = true;
        else if (!has) {
            fprintf(stderr, "ditto serve: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return -1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model_path = argv[++i];
        else if (!strcmp(a, "--host")) o->host = argv[++i];
        else if (!strcmp(a, "--port")) {
            if (cli_int("serve", a, argv[++i], 0, 65535, &o->port)) return -1;
        } else if (!strcmp(a, "--streams")) {
            if (cli_int("serve", a, argv[++i], 1, 4096, &o->streams)) return -1;
        } else if (!strcmp(a, "--ctx")) {
            if (cli_int("serve", a, argv[++i], 2, 1 << 24, &o->ctx)) return -1;
        } else if (!strcmp(a, "--threads")) {
            if (cli_int("serve", a, argv[++i], 1, 1024, &o->threads)) return -1;
        } else if (!strcmp(a, "--max-queue")) {
            if (cli_int("serve", a, argv[++i], 0, 1 << 20, &o->max_queue)) return -1;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (cli_int("serve", a, argv[++i], 1, 1 << 16, &o->prefill_chunk)) return -1;
        } else if (!strcmp(a, "--grace")) {
            char *end;
            o->grace = strtod(argv[++i], &end);
            if (*end || !(o->grace >= 0 && o->grace <= 86400)) {
                fprintf(stderr, "ditto serve: --grace expects seconds in 0..86400, got '%s'\n", argv[i]);
                return -1;
            }
        } else if (!strcmp(a, "--api-key")) {
            free(o->api_key);
            o->api_key = strdup(argv[++i]);
            if (!o->api_key[0]) {
                fprintf(stderr, "ditto serve: --api-key is empty\n");
                return -1;
            }
        } else if (!strcmp(a, "--api-key-file")) {
            free(o->api_key);
            if (!(o->api_key = read_key_file(argv[++i]))) return -1;
        } else {
            fprintf(stderr, "ditto serve: unknown option '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

static void model_id_of(const char *path, char *out, size_t n) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(out, n, "%s", base);
    size_t L = strlen(out);
    if (L > 5 && !strcmp(out + L - 5, ".gguf")) out[L - 5] = 0;
}

static int in_flight(api *A) {
    pthread_mutex_lock(&A->reg_mu);
    int n = A->n_reg;
    pthread_mutex_unlock(&A->reg_mu);
    return n;
}

/* Scheduler hook: one forward step took `seconds` (step-time histogram). */
static void api_on_step(void *user, int rows, double seconds) {
    (void)rows;
    metrics_step(user, seconds);
}

int api_serve_cmd(int argc, char **argv) {
    api *A = xcalloc(1, sizeof *A);
    int rc = parse_args(argc, argv, &A->o);
    if (rc) {
        free(A->o.api_key);
        free(A);
        return rc > 0 ? 0 : 2;
    }
    /* signals: handled by sigwait on this thread; every thread started below inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (access(A->o.model_path, R_OK)) {
        fprintf(stderr, "ditto serve: %s: %s\n", A->o.model_path, strerror(errno));
        free(A->o.api_key);
        free(A);
        return 1;
    }
    pthread_mutex_init(&A->reg_mu, NULL);
    A->met = metrics_new();
    uint64_t salt = 0;
    if (getrandom(&salt, sizeof salt, 0) != (ssize_t)sizeof salt) salt = (uint64_t)time(NULL) ^ (uint64_t)getpid();
    A->id_salt = salt;
    A->created = (long long)time(NULL);
    model_id_of(A->o.model_path, A->model_id, sizeof A->model_id);

    http_opts ho;
    http_opts_default(&ho);
    ho.host = A->o.host;
    ho.port = A->o.port;
    ho.max_body = API_MAX_BODY;
    ditto_err err;
    if (http_server_start(&A->http, &ho, handle, A, &err)) {
        fprintf(stderr, "ditto serve: %s\n", err.msg);
        metrics_free(A->met);
        free(A->o.api_key);
        free(A);
        return 1;
    }
    fprintf(stderr, "ditto serve: listening on %s\n", http_server_url(A->http));
    fflush(stderr);

    /* test hook: keeps /health at 503 for a while so the loading state can be observed */
    const char *delay = getenv("DITTO_SERVE_LOAD_DELAY_MS");
    if (delay && atoi(delay) > 0) usleep((useconds_t)atoi(delay) * 1000);

    bool tty = isatty(2);
    fprintf(stderr, "ditto serve: loading %s ...%s", A->o.model_path, tty ? "" : "\n");
    fflush(stderr);
    double t0 = time_now();
    rc = 1;
    if (model_load(&A->m, A->o.model_path, &err)) {
        fprintf(stderr, "%sditto serve: %s\n", tty ? "\n" : "", err.msg);
        goto out;
    }
    if (tokenizer_load(&A->tok, A->m->gguf, &err)) {
        fprintf(stderr, "%sditto serve: %s\n", tty ? "\n" : "", err.msg);
        goto out;
    }
    fprintf(stderr, "%sditto serve: loaded in %.2f s\n", tty ? " done\n" : "", time_now() - t0);
    const model_hparams *hp = &A->m->hp;
    A->n_vocab = hp->n_vocab;
    A->n_tok_vocab = tokenizer_n_vocab(A->tok);
    A->ctx = A->o.ctx;
    if (hp->n_ctx_train > 0 && A->ctx > hp->n_ctx_train) {
        fprintf(stderr, "ditto serve: --ctx %d capped to the model's context length %d\n", A->ctx, hp->n_ctx_train);
        A->ctx = hp->n_ctx_train;
    }
    if (tokenizer_chat_warning(A->tok)) fprintf(stderr, "ditto serve: %s\n", tokenizer_chat_warning(A->tok));
    engine_opts eo;
    engine_opts_default(&eo);
    eo.n_threads = A->o.threads;
    eo.max_streams = A->o.streams;
    eo.ctx = A->ctx;
    eo.max_rows = A->o.streams + A->o.prefill_chunk;
    eo.unify = A->o.unify;
    if (engine_create(&A->e, A->m, &eo, &err)) {
        fprintf(stderr, "ditto serve: %s\n", err.msg);
        goto out;
    }
    sched_opts so;
    sched_opts_default(&so);
    so.max_queue = A->o.max_queue;
    so.prefill_chunk = A->o.prefill_chunk;
    so.on_step = api_on_step;
    so.on_step_user = A->met;
    if (sched_create(&A->s, A->e, &so, &err) || sched_start(A->s, &err)) {
        fprintf(stderr, "ditto serve: %s\n", err.msg);
        goto out;
    }
    char arena[256];
    kv_arena_describe(A->e->kv, arena, sizeof arena);
    fprintf(stderr,
            "ditto serve: model %s: %s, %.1fM parameters, %d layers, vocab %d, context %d, chat template %s\n",
            A->model_id, hp->arch == MODEL_ARCH_QWEN3MOE ? "qwen3moe" : "qwen3", (double)A->m->n_params / 1e6,
            hp->n_layer, hp->n_vocab, hp->n_ctx_train, tokenizer_chat_kind(A->tok) == CHAT_QWEN3 ? "qwen3" : "chatml");
    fprintf(stderr,
            "ditto serve: streams %d, ctx %d, threads %d, max-queue %d, prefill-chunk %d, unify %s, api-key %s\n",
            A->o.streams, A->ctx, A->o.threads, A->o.max_queue, A->o.prefill_chunk, A->o.unify ? "on" : "off",
            A->o.api_key ? "on" : "off");
    fprintf(stderr, "ditto serve: %s\n", arena);
    fprintf(stderr, "ditto serve: backend %s\n", A->e->be->describe(A->e->be_state));
    char mem[160];
    A->e->be->memory(A->e->be_state, mem, sizeof mem);
    fprintf(stderr, "ditto serve: %s\n", mem);
    fprintf(stderr, "ditto serve: slots %d free, %d rows per step\n", A->o.streams, eo.max_rows);
    atomic_store(&A->phase, PH_READY);
    fprintf(stderr, "ditto serve: ready on %s\n", http_server_url(A->http));
    fflush(stderr);

    int sig = 0;
    while (sigwait(&sigs, &sig)) {
    }
    fprintf(stderr, "ditto serve: %s: no new requests; %d in flight (grace %.1f s)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", in_flight(A), A->o.grace);
    fflush(stderr);
    atomic_store(&A->phase, PH_DRAINING);
    http_server_quiesce(A->http);
    double until = time_now() + A->o.grace;
    struct timespec tick = {0, 50 * 1000 * 1000};
    while (in_flight(A) > 0 && time_now() < until)
        if (sigtimedwait(&sigs, NULL, &tick) > 0) break; /* a second signal: stop now */
    rc = 0;
out:
    if (A->s) sched_stop(A->s, true); /* whatever is left ends now; its clients get a clean end */
    for (int i = 0; i < 200 && in_flight(A) > 0; i++) usleep(10 * 1000);
    http_server_stop(A->http); /* joins every connection thread: no request runs after this */
    sched_free(A->s);
    engine_free(A->e);
    tokenizer_free(A->tok);
    model_free(A->m);
    metrics_free(A->met);
    pthread_mutex_destroy(&A->reg_mu);
    free(A->o.api_key);
    free(A);
    fprintf(stderr, "ditto serve: stopped\n");
    return rc;
}
