/* metrics.c — counters behind one mutex; histograms with fixed buckets;
 * Prometheus text exposition format 0.0.4. */
#include "metrics.h"

#include <pthread.h>
#include <string.h>

static const char *const ep_name[MET_EP_COUNT] = {"chat_completions", "completions", "models", "health",
                                                  "metrics", "slots", "other"};
static const char *const out_name[MET_OUT_COUNT] = {"stop", "length", "disconnect", "shutdown", "rejected", "ok"};
static const char *const rej_name[MET_REJ_COUNT] = {"invalid_request", "context_length_exceeded", "queue_full",
                                                    "unauthorized", "body_too_large", "not_found",
                                                    "method_not_allowed", "loading", "shutting_down", "internal"};
static const char *const phase_name[MET_PHASE_COUNT] = {"queued", "prefill", "decode"};

#define N_STEP_B 14
static const double step_bounds[N_STEP_B] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                             0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
#define N_REQ_B 12
static const double req_bounds[N_REQ_B] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

typedef struct hist {
    uint64_t bucket[16]; /* per bound, non-cumulative; [n] = above the last bound */
    uint64_t count;
    double sum;
} hist;

struct metrics {
    pthread_mutex_t mu;
    uint64_t requests[MET_EP_COUNT][MET_OUT_COUNT];
    uint64_t prompt_tok[MET_EP_COUNT][MET_OUT_COUNT];
    uint64_t completion_tok[MET_EP_COUNT][MET_OUT_COUNT];
    uint64_t rejected[MET_REJ_COUNT];
    uint64_t disconnects[MET_PHASE_COUNT];
    uint64_t status[600];
    hist step, ttft, duration;
    uint64_t folded_steps;
    double folded_seconds;
};

const char *metrics_phase_name(enum met_phase p) { return phase_name[p]; }

metrics *metrics_new(void) {
    metrics *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void metrics_free(metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(hist *h, const double *bounds, int nb, double v, uint64_t times) {
    int i = 0;
    while (i < nb && v > bounds[i]) i++;
    h->bucket[i] += times;
    h->count += times;
    h->sum += v * (double)times;
}

void metrics_request(metrics *m, enum met_endpoint ep, enum met_outcome out, uint64_t prompt_tokens,
                     uint64_t completion_tokens, double seconds) {
    pthread_mutex_lock(&m->mu);
    m->requests[ep][out]++;
    m->prompt_tok[ep][out] += prompt_tokens;
    m->completion_tok[ep][out] += completion_tokens;
    if ((ep == MET_EP_CHAT || ep == MET_EP_COMPLETIONS) && out != MET_OUT_REJECTED)
        observe(&m->duration, req_bounds, N_REQ_B, seconds, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_reject(metrics *m, enum met_reject why) {
    pthread_mutex_lock(&m->mu);
    m->rejected[why]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_disconnect(metrics *m, enum met_phase phase) {
    pthread_mutex_lock(&m->mu);
    m->disconnects[phase]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_status(metrics *m, int st) {
    if (st < 100 || st > 599) return;
    pthread_mutex_lock(&m->mu);
    m->status[st]++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_ttft(metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    observe(&m->ttft, req_bounds, N_REQ_B, seconds, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_step(metrics *m, double seconds) {
    pthread_mutex_lock(&m->mu);
    observe(&m->step, step_bounds, N_STEP_B, seconds, 1);
    pthread_mutex_unlock(&m->mu);
}

static void head(http_buf *o, const char *name, const char *type, const char *help) {
    hbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_hist(http_buf *o, const char *name, const char *help, const hist *h, const double *bounds, int nb) {
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < nb; i++) {
        cum += h->bucket[i];
        hbuf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], (unsigned long long)cum);
    }
    cum += h->bucket[nb];
    hbuf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, (unsigned long long)cum, name,
                h->sum, name, (unsigned long long)h->count);
}

void metrics_render(metrics *m, http_buf *o, const sched_stats *ss, int n_slots, int in_flight, int loading) {
    pthread_mutex_lock(&m->mu);
    head(o, "ditto_requests_total", "counter", "HTTP requests by endpoint and outcome.");
    for (int e = 0; e < MET_EP_COUNT; e++)
        for (int k = 0; k < MET_OUT_COUNT; k++)
            if (m->requests[e][k] || ((e == MET_EP_CHAT || e == MET_EP_COMPLETIONS) && k < MET_OUT_OK))
                hbuf_printf(o, "ditto_requests_total{endpoint=\"%s\",outcome=\"%s\"} %llu\n", ep_name[e], out_name[k],
                            (unsigned long long)m->requests[e][k]);
    head(o, "ditto_prompt_tokens_total", "counter", "Prompt tokens of generation requests by endpoint and outcome.");
    for (int e = 0; e <= MET_EP_COMPLETIONS; e++)
        for (int k = 0; k < MET_OUT_OK; k++)
            hbuf_printf(o, "ditto_prompt_tokens_total{endpoint=\"%s\",outcome=\"%s\"} %llu\n", ep_name[e], out_name[k],
                        (unsigned long long)m->prompt_tok[e][k]);
    head(o, "ditto_completion_tokens_total", "counter", "Generated tokens by endpoint and outcome.");
    for (int e = 0; e <= MET_EP_COMPLETIONS; e++)
        for (int k = 0; k < MET_OUT_OK; k++)
            hbuf_printf(o, "ditto_completion_tokens_total{endpoint=\"%s\",outcome=\"%s\"} %llu\n", ep_name[e],
                        out_name[k], (unsigned long long)m->completion_tok[e][k]);
    head(o, "ditto_rejections_total", "counter", "Requests refused, by reason.");
    for (int r = 0; r < MET_REJ_COUNT; r++)
        hbuf_printf(o, "ditto_rejections_total{reason=\"%s\"} %llu\n", rej_name[r], (unsigned long long)m->rejected[r]);
    head(o, "ditto_disconnects_total", "counter", "Streams cancelled because their client went away, by phase.");
    for (int p = 0; p < MET_PHASE_COUNT; p++)
        hbuf_printf(o, "ditto_disconnects_total{phase=\"%s\"} %llu\n", phase_name[p],
                    (unsigned long long)m->disconnects[p]);
    head(o, "ditto_http_responses_total", "counter", "HTTP responses by status code.");
    for (int c = 100; c < 600; c++)
        if (m->status[c]) hbuf_printf(o, "ditto_http_responses_total{code=\"%d\"} %llu\n", c, (unsigned long long)m->status[c]);
    render_hist(o, "ditto_step_seconds", "Engine step (one forward over the batch) duration.", &m->step, step_bounds,
                N_STEP_B);
    render_hist(o, "ditto_time_to_first_token_seconds", "Submission to first generated token.", &m->ttft, req_bounds,
                N_REQ_B);
    render_hist(o, "ditto_request_duration_seconds", "Generation request duration, submission to end.", &m->duration,
                req_bounds, N_REQ_B);
    pthread_mutex_unlock(&m->mu);

    head(o, "ditto_loading", "gauge", "1 while the model loads.");
    hbuf_printf(o, "ditto_loading %d\n", loading);
    head(o, "ditto_requests_in_flight", "gauge", "Generation requests submitted and not yet finished.");
    hbuf_printf(o, "ditto_requests_in_flight %d\n", in_flight);
    head(o, "ditto_slots_total", "gauge", "KV slots.");
    hbuf_printf(o, "ditto_slots_total %d\n", n_slots);
    sched_stats z = {0};
    if (!ss) ss = &z;
    head(o, "ditto_slots_active", "gauge", "Slots held by a stream (prefill or decode).");
    hbuf_printf(o, "ditto_slots_active %d\n", ss->active);
    head(o, "ditto_slots_free", "gauge", "Free slots.");
    hbuf_printf(o, "ditto_slots_free %d\n", loading ? 0 : ss->free_slots);
    head(o, "ditto_queue_depth", "gauge", "Requests waiting for a slot.");
    hbuf_printf(o, "ditto_queue_depth %d\n", ss->queued);
    head(o, "ditto_sched_steps_total", "counter", "Engine steps run.");
    hbuf_printf(o, "ditto_sched_steps_total %llu\n", (unsigned long long)ss->steps);
    head(o, "ditto_sched_step_seconds_total", "counter", "Time inside engine steps.");
    hbuf_printf(o, "ditto_sched_step_seconds_total %.9g\n", ss->step_seconds);
    head(o, "ditto_sched_admitted_total", "counter", "Streams admitted to a slot.");
    hbuf_printf(o, "ditto_sched_admitted_total %llu\n", (unsigned long long)ss->admitted);
    head(o, "ditto_sched_finished_total", "counter", "Streams finished (any reason).");
    hbuf_printf(o, "ditto_sched_finished_total %llu\n", (unsigned long long)ss->finished);
    head(o, "ditto_sched_cancelled_total", "counter", "Streams cancelled.");
    hbuf_printf(o, "ditto_sched_cancelled_total %llu\n", (unsigned long long)ss->cancelled);
    head(o, "ditto_sched_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
    hbuf_printf(o, "ditto_sched_prompt_tokens_total %llu\n", (unsigned long long)ss->prompt_tokens);
    head(o, "ditto_sched_generated_tokens_total", "counter", "Tokens sampled.");
    hbuf_printf(o, "ditto_sched_generated_tokens_total %llu\n", (unsigned long long)ss->generated_tokens);
}
