/* api_gen.c — generation requests: OpenAI JSON -> validated request -> scheduler;
 * tokens -> text (streaming detokenizer, stop strings) -> JSON or SSE; logprobs. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "api_internal.h"

#define POLL_MS 100

static int bad(apierr *E, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(apierr *E, const char *param, const char *fmt, ...) {
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_fail(E, 400, MET_REJ_INVALID, NULL, param, "%s", msg);
}

static int unsupported(apierr *E, const char *param, const char *what) {
    return api_fail(E, 400, MET_REJ_INVALID, "unsupported_parameter", param, "%s: unsupported (%s)", param, what);
}

/* ---- request parsing ------------------------------------------------------------------ */

/* The member, or NULL when absent or null. */
static cJSON *opt(const cJSON *o, const char *k) {
    cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static int get_bool(const cJSON *o, const char *k, const char *pname, bool *out, apierr *E) {
    cJSON *it = opt(o, k);
    if (!it) return 0;
    if (!cJSON_IsBool(it)) return bad(E, pname, "%s: expected a boolean", pname);
    *out = cJSON_IsTrue(it);
    return 0;
}

static int get_num(const cJSON *o, const char *k, double lo, double hi, bool integer, double *out, bool *set,
                   apierr *E) {
    cJSON *it = opt(o, k);
    if (!it) return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return bad(E, k, "%s: expected %s", k, integer ? "an integer" : "a number");
    double v = it->valuedouble;
    if (integer && v != floor(v)) return bad(E, k, "%s: expected an integer, got %g", k, v);
    if (v < lo || v > hi) {
        if (integer) return bad(E, k, "%s: %.0f is out of range [%.0f, %.0f]", k, v, lo, hi);
        return bad(E, k, "%s: %g is out of range [%g, %g]", k, v, lo, hi);
    }
    *out = v;
    if (set) *set = true;
    return 0;
}

/* A field we do not implement: fine when absent or at its neutral value. */
static int neutral_num(const cJSON *o, const char *k, double neutral, apierr *E) {
    double v = neutral;
    if (get_num(o, k, -1e30, 1e30, false, &v, NULL, E)) return -1;
    if (v != neutral) return unsupported(E, k, "only its default value is accepted");
    return 0;
}

static int parse_stop(const cJSON *root, gen *g, apierr *E) {
    cJSON *it = opt(root, "stop");
    if (!it) return 0;
    const cJSON *one[1] = {it};
    int n = 1;
    if (cJSON_IsArray(it)) {
        n = cJSON_GetArraySize(it);
        if (n > API_MAX_STOP) return bad(E, "stop", "stop: at most %d stop strings (got %d)", API_MAX_STOP, n);
    } else if (!cJSON_IsString(it))
        return bad(E, "stop", "stop: expected a string or an array of strings");
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsArray(it) ? cJSON_GetArrayItem(it, i) : one[0];
        char pname[32];
        snprintf(pname, sizeof pname, cJSON_IsArray(it) ? "stop[%d]" : "stop", i);
        if (!cJSON_IsString(s)) return bad(E, pname, "%s: expected a string", pname);
        size_t L = strlen(s->valuestring);
        if (L == 0) return bad(E, pname, "%s: must not be empty", pname);
        if (L > API_MAX_STOP_LEN) return bad(E, pname, "%s: longer than %d bytes", pname, API_MAX_STOP_LEN);
        if (!utf8_valid(s->valuestring, L)) return bad(E, pname, "%s: not valid UTF-8", pname);
        g->stop[g->n_stop] = strdup(s->valuestring);
        g->stop_len[g->n_stop++] = L;
    }
    return 0;
}

static const char *const roles[] = {"system", "user", "assistant", "tool", "developer"};

/* messages -> chat_render -> ids. */
static int parse_messages(api *A, const cJSON *root, gen *g, apierr *E) {
    cJSON *msgs = opt(root, "messages");
    if (!msgs) return bad(E, "messages", "messages: required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return bad(E, "messages", "messages: expected a non-empty array of messages");
    bool think = true;
    if (get_bool(root, "enable_thinking", "enable_thinking", &think, E)) return -1;
    cJSON *kw = opt(root, "chat_template_kwargs");
    if (kw) {
        if (!cJSON_IsObject(kw)) return bad(E, "chat_template_kwargs", "chat_template_kwargs: expected an object");
        if (get_bool(kw, "enable_thinking", "chat_template_kwargs.enable_thinking", &think, E)) return -1;
    }
    if (opt(root, "tools") && (!cJSON_IsArray(opt(root, "tools")) || cJSON_GetArraySize(opt(root, "tools")) > 0))
        return unsupported(E, "tools", "tool calling is not implemented");
    if (opt(root, "functions")) return unsupported(E, "functions", "function calling is not implemented");
    int n = cJSON_GetArraySize(msgs), rc = -1;
    chat_msg *cm = xcalloc((size_t)n, sizeof *cm);
    char **owned = xcalloc((size_t)n, sizeof *owned);
    char pname[96];
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        snprintf(pname, sizeof pname, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            bad(E, pname, "%s: expected an object", pname);
            goto out;
        }
        const cJSON *role = opt(m, "role");
        snprintf(pname, sizeof pname, "messages[%d].role", i);
        if (!role || !cJSON_IsString(role)) {
            bad(E, pname, "%s: expected one of system, user, assistant, tool or developer", pname);
            goto out;
        }
        int k = 0;
        while (k < 5 && strcmp(role->valuestring, roles[k])) k++;
        if (k == 5) {
            bad(E, pname, "%s: unknown role (expected system, user, assistant, tool or developer)", pname);
            goto out;
        }
        cm[i].role = k == 4 ? "system" : roles[k];
        const cJSON *c = opt(m, "content");
        snprintf(pname, sizeof pname, "messages[%d].content", i);
        if (!c) {
            if (k != 2) { /* only an assistant turn may come without content */
                bad(E, pname, "%s: required for role %s", pname, roles[k]);
                goto out;
            }
            cm[i].content = "";
        } else if (cJSON_IsString(c))
            cm[i].content = c->valuestring;
        else if (cJSON_IsArray(c)) {
            http_buf joined = {0};
            hbuf_add(&joined, "", 0);
            int np = cJSON_GetArraySize(c);
            if (np == 0) {
                hbuf_free(&joined);
                bad(E, pname, "%s: an empty array of content parts", pname);
                goto out;
            }
            for (int j = 0; j < np; j++) {
                const cJSON *part = cJSON_GetArrayItem(c, j);
                const cJSON *type = cJSON_IsObject(part) ? opt(part, "type") : NULL;
                const cJSON *text = cJSON_IsObject(part) ? opt(part, "text") : NULL;
                snprintf(pname, sizeof pname, "messages[%d].content[%d]", i, j);
                if (!type || !cJSON_IsString(type) || strcmp(type->valuestring, "text")) {
                    hbuf_free(&joined);
                    if (type && cJSON_IsString(type)) {
                        snprintf(pname, sizeof pname, "messages[%d].content[%d].type", i, j);
                        unsupported(E, pname, "only \"text\" content parts are supported");
                    } else
                        bad(E, pname, "%s: expected an object {\"type\": \"text\", \"text\": ...}", pname);
                    goto out;
                }
                if (!text || !cJSON_IsString(text)) {
                    hbuf_free(&joined);
                    snprintf(pname, sizeof pname, "messages[%d].content[%d].text", i, j);
                    bad(E, pname, "%s: expected a string", pname);
                    goto out;
                }
                if (j) hbuf_add(&joined, "\n", 1);
                hbuf_puts(&joined, text->valuestring);
            }
            owned[i] = joined.p;
            cm[i].content = joined.p;
        } else {
            bad(E, pname, "%s: expected a string or an array of text parts", pname);
            goto out;
        }
        const cJSON *rc_ = opt(m, "reasoning_content");
        if (rc_) {
            snprintf(pname, sizeof pname, "messages[%d].reasoning_content", i);
            if (!cJSON_IsString(rc_)) {
                bad(E, pname, "%s: expected a string", pname);
                goto out;
            }
            cm[i].reasoning_content = rc_->valuestring;
        }
        const cJSON *tc = opt(m, "tool_calls");
        if (tc && (!cJSON_IsArray(tc) || cJSON_GetArraySize(tc) > 0)) {
            snprintf(pname, sizeof pname, "messages[%d].tool_calls", i);
            unsupported(E, pname, "tool calls are not implemented");
            goto out;
        }
    }
    char *text = chat_render(A->tok, cm, (size_t)n, true, think);
    size_t n_ids = 0;
    ditto_err err;
    if (tokenizer_encode(A->tok, text, strlen(text), true, &g->prompt, &n_ids, &err)) {
        api_fail(E, 500, MET_REJ_INTERNAL, NULL, "messages", "tokenizer: %s", err.msg);
        free(text);
        goto out;
    }
    free(text);
    if (n_ids > (size_t)INT32_MAX) n_ids = INT32_MAX;
    g->n_prompt = (int)n_ids;
    rc = 0;
out:
    for (int i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(cm);
    return rc;
}

static int ids_of(api *A, const cJSON *arr, const char *pname, gen *g, apierr *E) {
    int n = cJSON_GetArraySize(arr);
    g->prompt = xmalloc(sizeof(int32_t) * (size_t)DT_MAX(n, 1));
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(arr, i);
        double v = t && cJSON_IsNumber(t) ? t->valuedouble : -1;
        if (!t || !cJSON_IsNumber(t) || v != floor(v) || v < 0 || v >= A->n_vocab) {
            char p[64];
            snprintf(p, sizeof p, "%s[%d]", pname, i);
            return bad(E, p, "%s: expected a token id in 0..%d", p, A->n_vocab - 1);
        }
        g->prompt[i] = (int32_t)v;
    }
    g->n_prompt = n;
    return 0;
}

static int parse_prompt(api *A, const cJSON *root, gen *g, apierr *E) {
    cJSON *p = opt(root, "prompt");
    if (!p) return bad(E, "prompt", "prompt: required");
    const char *text = NULL;
    if (cJSON_IsString(p)) text = p->valuestring;
    else if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        const cJSON *first = cJSON_GetArrayItem(p, 0);
        if (n == 0) return bad(E, "prompt", "prompt: must not be empty");
        if (cJSON_IsNumber(first)) {
            if (ids_of(A, p, "prompt", g, E)) return -1;
        } else if (n > 1 && (cJSON_IsString(first) || cJSON_IsArray(first)))
            return unsupported(E, "prompt", "one prompt per request: n = 1");
        else if (cJSON_IsString(first))
            text = first->valuestring;
        else if (cJSON_IsArray(first)) {
            if (cJSON_GetArraySize(first) == 0) return bad(E, "prompt[0]", "prompt[0]: must not be empty");
            if (ids_of(A, first, "prompt[0]", g, E)) return -1;
        } else
            return bad(E, "prompt", "prompt: expected a string or an array of token ids");
    } else
        return bad(E, "prompt", "prompt: expected a string or an array of token ids");
    if (text) {
        size_t n_ids = 0;
        ditto_err err;
        if (tokenizer_encode(A->tok, text, strlen(text), true, &g->prompt, &n_ids, &err))
            return api_fail(E, 500, MET_REJ_INTERNAL, NULL, "prompt", "tokenizer: %s", err.msg);
        if (n_ids > (size_t)INT32_MAX) n_ids = INT32_MAX;
        g->n_prompt = (int)n_ids;
    }
    if (g->n_prompt == 0) return bad(E, "prompt", "prompt: must not be empty (it encodes to no tokens)");
    return 0;
}

static int parse_request(api *A, const cJSON *root, gen *g, apierr *E) {
    bool chat = g->ep == MET_EP_CHAT;
    cJSON *it;
    double v = 0;
    bool set = false;
    if ((it = opt(root, "model")) && !cJSON_IsString(it)) return bad(E, "model", "model: expected a string");
    if (get_num(root, "n", -1e18, 1e18, true, &v, &set, E)) return -1;
    if (set && v != 1) return unsupported(E, "n", "only n = 1 is supported");
    if (get_bool(root, "stream", "stream", &g->stream, E)) return -1;
    if ((it = opt(root, "stream_options"))) {
        if (!cJSON_IsObject(it)) return bad(E, "stream_options", "stream_options: expected an object");
        if (get_bool(it, "include_usage", "stream_options.include_usage", &g->include_usage, E)) return -1;
    }
    /* sampling */
    sampler_params_default(&g->sp);
    g->sp.temperature = 1.0f;
    g->sp.top_p = 1.0f;
    g->sp.top_k = 0;
    g->sp.min_p = 0.0f;
    v = 1;
    if (get_num(root, "temperature", 0, 2, false, &v, NULL, E)) return -1;
    g->sp.temperature = (float)v;
    v = 1;
    if (get_num(root, "top_p", 0, 1, false, &v, NULL, E)) return -1;
    if (v <= 0) return bad(E, "top_p", "top_p: must be > 0 (got %g)", v);
    g->sp.top_p = (float)v;
    v = 0;
    if (get_num(root, "top_k", -1, 1e9, true, &v, NULL, E)) return -1;
    g->sp.top_k = v < 0 ? 0 : (int)DT_MIN(v, (double)A->n_vocab);
    v = 0;
    if (get_num(root, "min_p", 0, 1, false, &v, NULL, E)) return -1;
    g->sp.min_p = (float)v;
    set = false;
    /* a JSON number arrives as a double: seeds beyond 2^53 lose their low bits; the upper bound is the
     * largest double below 2^64, so the conversion to uint64_t stays defined */
    if (get_num(root, "seed", -9223372036854775808.0, 18446744073709549568.0, true, &v, &set, E)) return -1;
    g->sp.seed = !set ? api_random(A) : v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
    if (neutral_num(root, "presence_penalty", 0, E) || neutral_num(root, "frequency_penalty", 0, E) ||
        neutral_num(root, "repetition_penalty", 1, E))
        return -1;
    if ((it = opt(root, "logit_bias"))) {
        if (!cJSON_IsObject(it)) return bad(E, "logit_bias", "logit_bias: expected an object");
        if (it->child) return unsupported(E, "logit_bias", "logit biases are not implemented");
    }
    if ((it = opt(root, "response_format"))) {
        const cJSON *t = cJSON_IsObject(it) ? opt(it, "type") : NULL;
        if (!t || !cJSON_IsString(t)) return bad(E, "response_format", "response_format: expected {\"type\": ...}");
        if (strcmp(t->valuestring, "text")) return unsupported(E, "response_format", "only type \"text\"");
    }
    if (get_bool(root, "ignore_eos", "ignore_eos", &g->ignore_eos, E)) return -1;
    if (parse_stop(root, g, E)) return -1;
    /* logprobs */
    g->top_lp = -1;
    if (chat) {
        bool lp = false;
        if (get_bool(root, "logprobs", "logprobs", &lp, E)) return -1;
        v = 0;
        set = false;
        if (get_num(root, "top_logprobs", 0, API_MAX_TOP_LOGPROBS, true, &v, &set, E)) return -1;
        if (set && !lp) return bad(E, "top_logprobs", "top_logprobs: requires \"logprobs\": true");
        if (lp) g->top_lp = (int)v;
    } else {
        set = false;
        if (get_num(root, "logprobs", 0, API_MAX_TOP_LOGPROBS, true, &v, &set, E)) return -1;
        if (set) g->top_lp = (int)v;
        bool echo = false;
        if (get_bool(root, "echo", "echo", &echo, E)) return -1;
        if (echo) return unsupported(E, "echo", "echoing the prompt is not implemented");
        if ((it = opt(root, "suffix"))) {
            if (!cJSON_IsString(it)) return bad(E, "suffix", "suffix: expected a string");
            if (it->valuestring[0]) return unsupported(E, "suffix", "insertion is not implemented");
        }
        set = false;
        if (get_num(root, "best_of", 1, 1e9, true, &v, &set, E)) return -1;
        if (set && v != 1) return unsupported(E, "best_of", "only best_of = 1 is supported");
    }
    /* max tokens: max_completion_tokens wins over the legacy max_tokens */
    double mt = 0;
    bool mt_set = false;
    const char *mt_name = "max_tokens";
    if (get_num(root, "max_tokens", 1, INT_MAX, true, &mt, &mt_set, E)) return -1;
    if (opt(root, "max_completion_tokens")) {
        mt_name = "max_completion_tokens";
        if (get_num(root, "max_completion_tokens", 1, INT_MAX, true, &mt, &mt_set, E)) return -1;
    }
    /* the prompt last: tokenizing is the expensive part */
    if (chat ? parse_messages(A, root, g, E) : parse_prompt(A, root, g, E)) return -1;
    const char *what = chat ? "messages" : "prompt";
    if (mt_set) {
        if ((double)g->n_prompt + mt > A->ctx)
            return api_fail(E, 400, MET_REJ_CONTEXT, "context_length_exceeded", mt_name,
                            "This model's maximum context length is %d tokens. However, you requested %.0f tokens "
                            "(%d in the %s, %.0f in the completion). Please reduce the length of the %s or the "
                            "completion.",
                            A->ctx, g->n_prompt + mt, g->n_prompt, what, mt, what);
        g->max_tokens = (int)mt;
    } else {
        if (g->n_prompt >= A->ctx)
            return api_fail(E, 400, MET_REJ_CONTEXT, "context_length_exceeded", what,
                            "This model's maximum context length is %d tokens. However, your %s %s %d tokens, which "
                            "leaves no room for a completion.",
                            A->ctx, what, chat ? "come to" : "is", g->n_prompt);
        g->max_tokens = A->ctx - g->n_prompt;
    }
    return 0;
}

/* ---- the request object -------------------------------------------------------------------- */

static gen *gen_new(api *A, enum met_endpoint ep) {
    gen *g = xcalloc(1, sizeof *g);
    g->A = A;
    g->ep = ep;
    atomic_init(&g->gone, false);
    atomic_init(&g->gone_phase, -1);
    atomic_init(&g->n_seen, 0);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    detok_stream_init(&g->ds, A->tok);
    snprintf(g->id, sizeof g->id, "%s%016llx%08llx", ep == MET_EP_CHAT ? "chatcmpl-" : "cmpl-",
             (unsigned long long)api_random(A), (unsigned long long)(api_random(A) & 0xffffffffu));
    g->created = (long long)time(NULL);
    return g;
}

static void gen_free(gen *g) {
    free(g->prompt);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->lp);
    detok_stream_free(&g->ds);
    hbuf_free(&g->hold);
    hbuf_free(&g->text);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

static enum met_phase phase_of(gen *g) {
    int n;
    enum sched_state s = sched_stream_read(g->A->s, g->st, NULL, 0, &n, 0);
    return s == SCHED_QUEUED ? MET_PHASE_QUEUED : s == SCHED_PREFILL ? MET_PHASE_PREFILL : MET_PHASE_DECODE;
}

/* Watcher thread: the client hung up. */
static void on_hangup(void *ctx) {
    gen *g = ctx;
    if (atomic_load(&g->gone)) return;
    atomic_store(&g->gone_phase, (int)phase_of(g));
    atomic_store(&g->gone, true);
    sched_cancel(g->A->s, g->st);
}

/* log-softmax of the row; the sampled token's value and the top n (ties: lower id). */
static void lp_compute(api *A, gen *g, const float *x, int32_t token, int idx) {
    int V = A->n_vocab;
    lp_entry *e = &g->lp[idx];
    float mx = -INFINITY;
    for (int i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i];
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    e->lp = (float)(x[token] - lse);
    int k = g->top_lp, n = 0;
    for (int i = 0; i < V && k > 0; i++) {
        if (n == k && !(x[i] > x[e->top_id[n - 1]])) continue;
        int j = n < k ? n++ : n - 1;
        while (j > 0 && x[i] > x[e->top_id[j - 1]]) {
            e->top_id[j] = e->top_id[j - 1];
            j--;
        }
        e->top_id[j] = i;
    }
    e->n_top = n;
    for (int j = 0; j < n; j++) e->top_lp[j] = (float)(x[e->top_id[j]] - lse);
}

/* Step thread, after each sampled token with the logits row it came from (and once with
 * token -1, logits NULL, for a stream that ended without a new token). */
static void on_token(void *user, sched_stream *st, int32_t token, const float *logits, enum sched_finish fin) {
    gen *g = user;
    api *A = g->A;
    (void)st;
    if (token >= 0) {
        int idx = atomic_fetch_add(&g->n_seen, 1);
        if (idx == 0) metrics_ttft(A->met, time_now() - g->t0);
        if (g->lp && idx < g->max_tokens) {
            lp_compute(A, g, logits, token, idx);
            pthread_mutex_lock(&g->mu);
            g->lp_ready = idx + 1;
            pthread_cond_broadcast(&g->cv);
            pthread_mutex_unlock(&g->mu);
        }
    }
    if (fin != SCHED_FINISH_NONE) { /* the last callback: g may be freed right after */
        pthread_mutex_lock(&g->mu);
        g->cb_final = true;
        pthread_cond_broadcast(&g->cv);
        pthread_mutex_unlock(&g->mu);
    }
}

/* ---- text pipeline ---------------------------------------------------------------------------- */

static bool tok_hidden(const api *A, int32_t t) {
    return t < 0 || t >= A->n_tok_vocab || tokenizer_token_type(A->tok, t) == TOK_TYPE_CONTROL ||
           tokenizer_is_eog(A->tok, t);
}

/* Moves text out of hold into out: up to a stop string (which ends the stream), or
 * all but the longest tail that could still begin one (all of it when final). */
static void release_text(gen *g, http_buf *out, bool final) {
    http_buf *h = &g->hold;
    if (g->n_stop && h->n) {
        size_t best = SIZE_MAX;
        for (int i = 0; i < g->n_stop; i++) {
            const char *f = memmem(h->p, h->n, g->stop[i], g->stop_len[i]);
            if (f && (size_t)(f - h->p) < best) best = (size_t)(f - h->p);
        }
        if (best != SIZE_MAX) {
            hbuf_add(out, h->p, best);
            g->released += best;
            h->n = 0;
            g->text_done = true;
            g->finish = FIN_STOP;
            sched_cancel(g->A->s, g->st);
            return;
        }
        if (!final) {
            size_t keep = 0;
            for (int i = 0; i < g->n_stop; i++)
                for (size_t k = DT_MIN(g->stop_len[i] - 1, h->n); k > keep; k--)
                    if (h->p[h->n - k] == g->stop[i][0] && !memcmp(h->p + h->n - k, g->stop[i], k)) {
                        keep = k;
                        break;
                    }
            hbuf_add(out, h->p, h->n - keep);
            g->released += h->n - keep;
            memmove(h->p, h->p + h->n - keep, keep);
            h->n = keep;
            return;
        }
    }
    hbuf_add(out, h->p, h->n);
    g->released += h->n;
    h->n = 0;
}

/* The end of the tokens in [from, to) whose text began inside the released text: the
 * logprobs that may go out (a token cut off whole by a stop string never does). */
static int lp_visible_end(const gen *g, int from, int to) {
    if (!g->lp) return from;
    to = DT_MIN(to, g->max_tokens);
    if (g->text_done && g->released == g->pushed) return DT_MAX(from, to); /* all of it went out: no cut */
    while (from < to && g->lp[from].start < g->released) from++;
    return from;
}

static void feed(gen *g, int32_t t, http_buf *out) {
    if (g->text_done) return;
    api *A = g->A;
    int idx = g->n_tok++;
    bool hidden = tok_hidden(A, t);
    if (g->lp && idx < g->max_tokens) {
        /* the step thread computes them right after publishing the token */
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 30;
        pthread_mutex_lock(&g->mu);
        while (g->lp_ready <= idx && !g->lp_bad)
            if (pthread_cond_timedwait(&g->cv, &g->mu, &dl) == ETIMEDOUT) g->lp_bad = true;
        pthread_mutex_unlock(&g->mu);
        g->lp[idx].id = t;
        g->lp[idx].hidden = hidden;
        g->lp[idx].start = g->pushed;
    }
    if (!hidden) {
        size_t n;
        const char *p = detok_stream_push(&g->ds, t, &n);
        hbuf_add(&g->hold, p, n);
        g->pushed += n;
    }
    release_text(g, out, false);
}

/* Reads whatever the stream has (waiting up to wait_ms for something) into out. */
static void pump(gen *g, int wait_ms, http_buf *out) {
    api *A = g->A;
    int32_t buf[64];
    for (;;) {
        int n = 0;
        enum sched_state s = sched_stream_read(A->s, g->st, buf, 64, &n, wait_ms);
        for (int i = 0; i < n; i++) feed(g, buf[i], out);
        if (s == SCHED_DONE) {
            g->done = true;
            if (!g->text_done) {
                enum sched_finish f = sched_stream_finish(A->s, g->st);
                g->finish = f == SCHED_FINISH_STOP ? FIN_STOP : f == SCHED_FINISH_LENGTH ? FIN_LENGTH : FIN_CANCEL;
                g->text_done = true;
                if (g->finish != FIN_CANCEL) {
                    size_t k;
                    const char *p = detok_stream_flush(&g->ds, &k);
                    hbuf_add(&g->hold, p, k);
                    g->pushed += k;
                    release_text(g, out, true);
                }
            }
            return;
        }
        if (n < 64) return;
        wait_ms = 0;
    }
}

/* ---- JSON pieces --------------------------------------------------------------------------------- */

static void jbytes(http_buf *b, const char *p, size_t n) {
    hbuf_add(b, "[", 1);
    for (size_t i = 0; i < n; i++) hbuf_printf(b, "%s%u", i ? "," : "", (unsigned)(unsigned char)p[i]);
    hbuf_add(b, "]", 1);
}

static const char *piece_of(const api *A, int32_t id, size_t *n) {
    const char *p = tokenizer_piece(A->tok, id, n);
    if (!p) {
        *n = 0;
        return "";
    }
    return p;
}

/* logprobs of tokens [from, to) in the endpoint's shape, or null. */
static void write_logprobs(gen *g, http_buf *b, int from, int to) {
    api *A = g->A;
    if (!g->lp || g->lp_bad) {
        hbuf_puts(b, "null");
        return;
    }
    to = DT_MIN(to, g->max_tokens);
    size_t n;
    if (g->ep == MET_EP_CHAT) {
        hbuf_puts(b, "{\"content\":[");
        bool first = true;
        for (int i = from; i < to; i++) {
            const lp_entry *e = &g->lp[i];
            if (e->hidden) continue;
            const char *p = piece_of(A, e->id, &n);
            hbuf_puts(b, first ? "{\"token\":" : ",{\"token\":");
            first = false;
            jstr(b, p, n);
            hbuf_puts(b, ",\"logprob\":");
            jnum(b, e->lp);
            hbuf_puts(b, ",\"bytes\":");
            jbytes(b, p, n);
            hbuf_puts(b, ",\"top_logprobs\":[");
            for (int j = 0; j < e->n_top; j++) {
                p = piece_of(A, e->top_id[j], &n);
                hbuf_puts(b, j ? ",{\"token\":" : "{\"token\":");
                jstr(b, p, n);
                hbuf_puts(b, ",\"logprob\":");
                jnum(b, e->top_lp[j]);
                hbuf_puts(b, ",\"bytes\":");
                jbytes(b, p, n);
                hbuf_puts(b, "}");
            }
            hbuf_puts(b, "]}");
        }
        hbuf_puts(b, "],\"refusal\":null}");
        return;
    }
    http_buf toks = {0}, lps = {0}, tops = {0}, offs = {0};
    int k = 0;
    for (int i = from; i < to; i++) {
        const lp_entry *e = &g->lp[i];
        if (e->hidden) continue;
        const char *p = piece_of(A, e->id, &n);
        const char *sep = k++ ? "," : "";
        hbuf_puts(&toks, sep);
        jstr(&toks, p, n);
        hbuf_puts(&lps, sep);
        jnum(&lps, e->lp);
        hbuf_printf(&offs, "%s%zu", sep, g->lp_off);
        for (size_t j = 0; j < n; j++) g->lp_off += ((unsigned char)p[j] & 0xC0) != 0x80; /* characters */
        hbuf_puts(&tops, sep);
        hbuf_puts(&tops, "{");
        for (int j = 0; j < e->n_top; j++) {
            size_t tn;
            const char *tp = piece_of(A, e->top_id[j], &tn);
            if (j) hbuf_puts(&tops, ",");
            jstr(&tops, tp, tn);
            hbuf_puts(&tops, ":");
            jnum(&tops, e->top_lp[j]);
        }
        hbuf_puts(&tops, "}");
    }
    hbuf_printf(b, "{\"tokens\":[%s],\"token_logprobs\":[%s],\"top_logprobs\":[%s],\"text_offset\":[%s]}",
                toks.p ? toks.p : "", lps.p ? lps.p : "", tops.p ? tops.p : "", offs.p ? offs.p : "");
    hbuf_free(&toks);
    hbuf_free(&lps);
    hbuf_free(&tops);
    hbuf_free(&offs);
}

static const char *finish_name(int f) { return f == FIN_LENGTH ? "length" : "stop"; }

static void write_usage(gen *g, http_buf *b) {
    hbuf_printf(b, "{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}", g->n_prompt, g->n_tok,
                g->n_prompt + g->n_tok);
}

static void chunk_open(gen *g, http_buf *o) {
    hbuf_puts(o, "data: {\"id\":");
    jstr_c(o, g->id);
    hbuf_printf(o, ",\"object\":\"%s\",\"created\":%lld,\"model\":",
                g->ep == MET_EP_CHAT ? "chat.completion.chunk" : "text_completion", g->created);
    jstr_c(o, g->A->model_id);
    hbuf_puts(o, ",\"system_fingerprint\":\"ditto\",\"choices\":[");
}

/* One SSE chunk: a text delta (or the role, or the finish) with logprobs [lp_from, lp_to). */
static void sse_chunk(gen *g, http_buf *o, const char *text, size_t n, int lp_from, int lp_to, bool role,
                      const char *finish) {
    chunk_open(g, o);
    if (g->ep == MET_EP_CHAT) {
        hbuf_puts(o, "{\"index\":0,\"delta\":{");
        if (role) hbuf_puts(o, "\"role\":\"assistant\",\"content\":\"\"");
        else if (!finish) {
            hbuf_puts(o, "\"content\":");
            jstr(o, text, n);
        }
        hbuf_puts(o, "},\"logprobs\":");
    } else {
        hbuf_puts(o, "{\"text\":");
        jstr(o, text, n);
        hbuf_puts(o, ",\"index\":0,\"logprobs\":");
    }
    if (lp_to > lp_from) write_logprobs(g, o, lp_from, lp_to);
    else hbuf_puts(o, "null");
    hbuf_puts(o, ",\"finish_reason\":");
    if (finish) jstr_c(o, finish);
    else hbuf_puts(o, "null");
    hbuf_puts(o, "}]");
    if (g->include_usage) hbuf_puts(o, ",\"usage\":null");
    hbuf_puts(o, "}\n\n");
}

static void sse_shutdown_event(http_buf *o) {
    hbuf_puts(o, "data: {\"error\":{\"message\":\"the server is shutting down; the stream was cancelled\","
                 "\"type\":\"server_error\",\"param\":null,\"code\":\"server_shutting_down\"}}\n\n");
}

/* ---- ending a request ------------------------------------------------------------------------------ */

static void registry_add(api *A, gen *g) {
    pthread_mutex_lock(&A->reg_mu);
    g->next = A->reg;
    if (A->reg) A->reg->prev = g;
    A->reg = g;
    A->n_reg++;
    pthread_mutex_unlock(&A->reg_mu);
}

static void gen_end(gen *g) {
    api *A = g->A;
    http_unwatch(g->watch);
    g->watch = NULL;
    enum met_outcome out;
    int phase = atomic_load(&g->gone_phase);
    if (g->completed) out = g->finish == FIN_LENGTH ? MET_OUT_LENGTH : MET_OUT_STOP;
    else if (g->shutdown_end) out = MET_OUT_SHUTDOWN;
    else {
        out = MET_OUT_DISCONNECT;
        if (phase < 0) phase = (int)phase_of(g);
    }
    sched_cancel(A->s, g->st); /* no-op when it already ended */
    pthread_mutex_lock(&g->mu);
    while (!g->cb_final) pthread_cond_wait(&g->cv, &g->mu); /* the slot is free after this */
    pthread_mutex_unlock(&g->mu);
    if (out == MET_OUT_DISCONNECT) metrics_disconnect(A->met, (enum met_phase)phase);
    int completion = g->completed ? g->n_tok : atomic_load(&g->n_seen);
    double dt = time_now() - g->t0;
    metrics_request(A->met, g->ep, out, (uint64_t)g->n_prompt, (uint64_t)completion, dt);
    if (!A->o.quiet) {
        static const char *const oname[] = {"stop", "length", "disconnect", "shutdown", "rejected", "ok"};
        fprintf(stderr, "ditto serve: %s %s%s prompt %d completion %d %s%s%s %.3f s\n", g->id,
                g->ep == MET_EP_CHAT ? "chat" : "completions", g->stream ? " stream" : "", g->n_prompt, completion,
                oname[out], out == MET_OUT_DISCONNECT ? " in " : "",
                out == MET_OUT_DISCONNECT ? metrics_phase_name((enum met_phase)phase) : "", dt);
    }
    pthread_mutex_lock(&A->reg_mu);
    if (g->prev) g->prev->next = g->next;
    else A->reg = g->next;
    if (g->next) g->next->prev = g->prev;
    A->n_reg--;
    pthread_mutex_unlock(&A->reg_mu);
    sched_stream_release(A->s, g->st);
    gen_free(g);
}

/* ---- streaming ----------------------------------------------------------------------------------- */

static int sse_produce(void *ctx, http_buf *out) {
    gen *g = ctx;
    if (g->sse_done) return 0;
    if (atomic_load(&g->gone)) return -1;
    if (!g->sent_head) {
        g->sent_head = true;
        if (g->ep == MET_EP_CHAT) {
            sse_chunk(g, out, "", 0, 0, 0, true, NULL);
            return 1;
        }
    }
    http_buf text = {0};
    int from = g->lp_sent;
    pump(g, POLL_MS, &text);
    int to = lp_visible_end(g, from, g->n_tok);
    g->lp_sent = to;
    if (text.n || to > from) sse_chunk(g, out, text.p ? text.p : "", text.n, from, to, false, NULL);
    hbuf_free(&text);
    if (!g->done) return 1;
    if (atomic_load(&g->gone)) return -1;
    if (g->finish == FIN_CANCEL) {
        sse_shutdown_event(out);
        g->shutdown_end = true;
    } else {
        sse_chunk(g, out, "", 0, 0, 0, false, finish_name(g->finish));
        if (g->include_usage) {
            chunk_open(g, out);
            hbuf_puts(out, "],\"usage\":");
            write_usage(g, out);
            hbuf_puts(out, "}\n\n");
        }
        g->completed = true;
    }
    hbuf_puts(out, "data: [DONE]\n\n");
    g->sse_done = true;
    return 0;
}

static void sse_finish(void *ctx) { gen_end(ctx); }

/* ---- non-streaming -------------------------------------------------------------------------------- */

static void respond_full(gen *g, http_req *r) {
    api *A = g->A;
    http_buf o = {0};
    bool chat = g->ep == MET_EP_CHAT;
    hbuf_puts(&o, "{\"id\":");
    jstr_c(&o, g->id);
    hbuf_printf(&o, ",\"object\":\"%s\",\"created\":%lld,\"model\":", chat ? "chat.completion" : "text_completion",
                g->created);
    jstr_c(&o, A->model_id);
    hbuf_puts(&o, ",\"system_fingerprint\":\"ditto\",\"choices\":[{\"index\":0,");
    hbuf_puts(&o, chat ? "\"message\":{\"role\":\"assistant\",\"content\":" : "\"text\":");
    jstr(&o, g->text.p ? g->text.p : "", g->text.n);
    hbuf_puts(&o, chat ? "},\"logprobs\":" : ",\"logprobs\":");
    write_logprobs(g, &o, 0, lp_visible_end(g, 0, g->n_tok));
    hbuf_puts(&o, ",\"finish_reason\":");
    jstr_c(&o, finish_name(g->finish));
    hbuf_puts(&o, "}],\"usage\":");
    write_usage(g, &o);
    hbuf_puts(&o, "}");
    api_reply(A, r, 200, "application/json", o.p, o.n, NULL);
    hbuf_free(&o);
}

/* ---- entry ------------------------------------------------------------------------------------------ */

/* The byte offset of the first NUL in body[0..len) — a raw 0 byte anywhere, or a \u0000 escape
 * inside a JSON string — or -1: cJSON's strings end at a NUL (it accepts a raw one too), so such a
 * string would be cut short without a word. */
static long json_nul_at(const char *body, size_t len) {
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char ch = body[i];
        if (ch == '\0') return (long)i;
        if (!in_str) {
            in_str = ch == '"';
        } else if (ch == '"') {
            in_str = false;
        } else if (ch == '\\' && i + 1 < len) {
            if (body[i + 1] == 'u' && i + 5 < len && !memcmp(body + i + 2, "0000", 4)) return (long)i;
            i++; /* the escaped character: a quote or backslash after it is not special */
        }
    }
    return -1;
}

void api_generate(api *A, http_req *r, enum met_endpoint ep) {
    apierr E = {0};
    int ph = atomic_load(&A->phase);
    if (ph != PH_READY) {
        if (ph == PH_LOADING) api_fail(&E, 503, MET_REJ_LOADING, "model_loading", NULL, "the model is still loading");
        else api_fail(&E, 503, MET_REJ_SHUTTING_DOWN, "server_shutting_down", NULL, "the server is shutting down");
        api_send_error(A, r, ep, &E);
        return;
    }
    size_t len;
    const char *body = http_req_body(r, &len);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        bad(&E, NULL, "invalid JSON in the request body (at byte %zu)", at);
        api_send_error(A, r, ep, &E);
        return;
    }
    while (end && end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')) end++;
    if (end && end < body + len) {
        bad(&E, NULL, "invalid JSON in the request body: unexpected data at byte %zu", (size_t)(end - body));
        cJSON_Delete(root);
        api_send_error(A, r, ep, &E);
        return;
    }
    long nul = json_nul_at(body, len);
    if (nul >= 0) {
        bad(&E, NULL, "the request body holds a NUL character (\\u0000 or a 0 byte, at byte %ld), which is not accepted",
            nul);
        cJSON_Delete(root);
        api_send_error(A, r, ep, &E);
        return;
    }
    if (!cJSON_IsObject(root)) {
        bad(&E, NULL, "the request body must be a JSON object");
        cJSON_Delete(root);
        api_send_error(A, r, ep, &E);
        return;
    }
    gen *g = gen_new(A, ep);
    int prc = parse_request(A, root, g, &E);
    cJSON_Delete(root);
    if (prc) {
        gen_free(g);
        api_send_error(A, r, ep, &E);
        return;
    }
    if (g->top_lp >= 0) {
        g->lp = xcalloc((size_t)g->max_tokens, sizeof *g->lp);
    }
    sched_request rq = {0};
    rq.prompt = g->prompt;
    rq.n_prompt = g->n_prompt;
    rq.max_tokens = g->max_tokens;
    rq.sampling = g->sp;
    rq.ignore_eos = g->ignore_eos;
    rq.on_token = on_token;
    rq.user = g;
    ditto_err err;
    g->t0 = time_now();
    enum sched_status st = sched_submit(A->s, &rq, &g->st, &err);
    if (st != SCHED_OK) {
        if (st == SCHED_ERR_QUEUE_FULL)
            api_fail(&E, 429, MET_REJ_QUEUE_FULL, "queue_full", NULL, "Server busy: %s; retry later", err.msg);
        else if (st == SCHED_ERR_CONTEXT)
            api_fail(&E, 400, MET_REJ_CONTEXT, "context_length_exceeded", "max_tokens", "%s", err.msg);
        else if (st == SCHED_ERR_SHUTDOWN)
            api_fail(&E, 503, MET_REJ_SHUTTING_DOWN, "server_shutting_down", NULL, "%s", err.msg);
        else {
            char param[64];
            snprintf(param, sizeof param, "%.*s", (int)strcspn(err.msg, ":"), err.msg);
            api_fail(&E, 400, MET_REJ_INVALID, NULL, param, "%s", err.msg);
        }
        gen_free(g);
        api_send_error(A, r, ep, &E);
        return;
    }
    registry_add(A, g);
    g->watch = http_watch_hangup(http_req_server(r), r, on_hangup, g);
    if (g->stream) {
        static const char *const hdrs[] = {"Cache-Control", "no-cache", "X-Accel-Buffering", "no", NULL};
        metrics_status(A->met, 200);
        http_respond_stream(r, 200, "text/event-stream", hdrs, sse_produce, sse_finish, g);
        return;
    }
    while (!g->done && !atomic_load(&g->gone)) pump(g, POLL_MS, &g->text);
    if (atomic_load(&g->gone)) http_respond_abort(r);
    else if (g->finish == FIN_CANCEL) {
        g->shutdown_end = true;
        api_fail(&E, 503, MET_REJ_SHUTTING_DOWN, "server_shutting_down", NULL,
                 "the server is shutting down; the request was cancelled");
        metrics_reject(A->met, MET_REJ_SHUTTING_DOWN);
        /* a plain error body; the request itself is counted by gen_end as "shutdown" */
        http_buf eb = {0};
        hbuf_puts(&eb, "{\"error\":{\"message\":");
        jstr_c(&eb, E.msg);
        hbuf_puts(&eb, ",\"type\":\"server_error\",\"param\":null,\"code\":\"server_shutting_down\"}}");
        api_reply(A, r, 503, "application/json", eb.p, eb.n, NULL);
        hbuf_free(&eb);
    } else {
        respond_full(g, r);
        g->completed = true;
    }
    gen_end(g);
}
