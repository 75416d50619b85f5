/* metrics.h — the server's counters and the Prometheus text rendering of /metrics.
 * Every function is thread-safe. */
#ifndef DITTO_METRICS_H
#define DITTO_METRICS_H

#include <stdint.h>

#include "http.h"
#include "sched.h"

enum met_endpoint { MET_EP_CHAT = 0, MET_EP_COMPLETIONS, MET_EP_MODELS, MET_EP_HEALTH, MET_EP_METRICS, MET_EP_SLOTS,
                    MET_EP_OTHER, MET_EP_COUNT };
/* stop/length: finished with that finish_reason; disconnect: the client went away;
 * shutdown: ended by server shutdown; rejected: refused before running (4xx/5xx);
 * ok: a non-generating endpoint answered 2xx. */
enum met_outcome { MET_OUT_STOP = 0, MET_OUT_LENGTH, MET_OUT_DISCONNECT, MET_OUT_SHUTDOWN, MET_OUT_REJECTED, MET_OUT_OK,
                   MET_OUT_COUNT };
enum met_reject { MET_REJ_INVALID = 0, MET_REJ_CONTEXT, MET_REJ_QUEUE_FULL, MET_REJ_UNAUTHORIZED, MET_REJ_TOO_LARGE,
                  MET_REJ_NOT_FOUND, MET_REJ_METHOD, MET_REJ_LOADING, MET_REJ_SHUTTING_DOWN, MET_REJ_INTERNAL,
                  MET_REJ_COUNT };
enum met_phase { MET_PHASE_QUEUED = 0, MET_PHASE_PREFILL, MET_PHASE_DECODE, MET_PHASE_COUNT };

typedef struct metrics metrics;

metrics *metrics_new(void);
void metrics_free(metrics *m);

void metrics_request(metrics *m, enum met_endpoint ep, enum met_outcome out, uint64_t prompt_tokens,
                     uint64_t completion_tokens, double seconds);
void metrics_reject(metrics *m, enum met_reject why);
void metrics_disconnect(metrics *m, enum met_phase phase);
void metrics_status(metrics *m, int http_status);
void metrics_ttft(metrics *m, double seconds);
/* Folds the scheduler's running totals into the step-time histogram: the steps
 * since the last call are observed at their mean duration. */
/* One engine step of the given duration (the scheduler's on_step hook). */
void metrics_step(metrics *m, double seconds);

/* Renders everything; ss is NULL while the model loads. */
void metrics_render(metrics *m, http_buf *out, const sched_stats *ss, int n_slots, int in_flight, int loading);

const char *metrics_phase_name(enum met_phase p);

#endif
