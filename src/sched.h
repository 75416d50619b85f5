/* sched.h — continuous batching: an admission queue, KV slots held by streams
 * from admission to retirement, and a step loop that mixes chunked prefill with
 * every running decoder in one forward call.
 *
 * Thread safety: sched_submit, sched_cancel, sched_stream_read and
 * sched_stream_release may be called from any thread while the step loop runs
 * (in its own thread via sched_start, or driven by the caller with sched_step). */
#ifndef DITTO_SCHED_H
#define DITTO_SCHED_H

#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "sampler.h"

enum sched_state { SCHED_QUEUED = 0, SCHED_PREFILL, SCHED_DECODE, SCHED_DONE };
enum sched_finish {
    SCHED_FINISH_NONE = 0,
    SCHED_FINISH_STOP,   /* EOS or a stop token (that token is the last one reported) */
    SCHED_FINISH_LENGTH, /* max_tokens reached */
    SCHED_FINISH_CANCEL, /* sched_cancel */
};
enum sched_status {
    SCHED_OK = 0,
    SCHED_ERR_INVALID,      /* malformed request (message names the field) */
    SCHED_ERR_CONTEXT,      /* prompt + max_tokens over the context cap */
    SCHED_ERR_QUEUE_FULL,   /* admission queue full: retry later */
    SCHED_ERR_SHUTDOWN,     /* the scheduler is stopping */
};

typedef struct sched_stream sched_stream;

/* Called on the step thread after each token with the logits row it was sampled from
 * (n_vocab floats, valid during the call only), and once with token -1 and logits NULL
 * when a stream ends without a new token (cancelled). Must not block for long. */
typedef void (*sched_on_token)(void *user, sched_stream *s, int32_t token, const float *logits,
                               enum sched_finish finish);
/* Called on the step thread after each forward step. */
typedef void (*sched_on_step)(void *user, int rows, double seconds);

typedef struct sched_request {
    const int32_t *prompt; /* copied */
    int n_prompt;
    int max_tokens;        /* >= 1 */
    sampler_params sampling;
    const int32_t *stop_ids; /* copied; EOS is a stop token unless ignore_eos */
    int n_stop;
    bool ignore_eos;
    bool record_hashes;    /* keep a hash of each step's logits (tests, --logits-hash) */
    sched_on_token on_token;
    void *user;
} sched_request;

typedef struct sched_opts {
    int max_queue;       /* waiting requests beyond the slots */
    int prefill_chunk;   /* most prompt rows of one stream per step */
    sched_on_step on_step; /* optional */
    void *on_step_user;
} sched_opts;

typedef struct sched sched;

typedef struct sched_stats {
    int active, free_slots, queued;
    uint64_t steps, admitted, finished, cancelled, rejected_context, rejected_queue;
    uint64_t prompt_tokens, generated_tokens;
    double step_seconds;   /* total time inside forward steps */
} sched_stats;

void sched_opts_default(sched_opts *o);
/* The engine (not owned) must have max_rows >= max_streams. */
int sched_create(sched **out, engine *e, const sched_opts *o, ditto_err *err);
/* Stops the loop thread (if started), cancels whatever is left, frees. Every stream
 * handle must have been released (sched_stream_release) before: asserted. */
void sched_free(sched *s);

/* Admits a request into the queue. Returns SCHED_OK and *out (a handle the caller
 * must sched_stream_release), or an error status with err naming the field/numbers. */
enum sched_status sched_submit(sched *s, const sched_request *r, sched_stream **out, ditto_err *err);
/* Requests cancellation; honoured before the next step. */
void sched_cancel(sched *s, sched_stream *st);
/* Copies up to cap tokens generated since the last read into out; *n gets the count.
 * wait_ms > 0 blocks until a token, the end, or the timeout. Returns the stream's state. */
enum sched_state sched_stream_read(sched *s, sched_stream *st, int32_t *out, int cap, int *n, int wait_ms);
enum sched_finish sched_stream_finish(sched *s, sched_stream *st);
/* Step hashes recorded so far (record_hashes): returns count, copies up to cap. */
int sched_stream_hashes(sched *s, sched_stream *st, uint64_t *out, int cap);
int sched_stream_slot(sched *s, sched_stream *st); /* slot while admitted, else -1 */
uint64_t sched_stream_id(const sched_stream *st);
/* Drops the client's handle (cancelling the stream if still running). Callbacks may
 * still fire for the step in flight and for the end notice: keep `user` valid until the
 * callback with a finish reason has run. */
void sched_stream_release(sched *s, sched_stream *st);

/* Runs one step: cancellations, admissions, one forward over decoders + prefill
 * chunks, sampling, stop checks, retirements. Returns the number of rows run
 * (0 = nothing to do), or -1 on an internal error (message in err). */
int sched_step(sched *s, ditto_err *err);
bool sched_idle(sched *s);

/* Step loop in a background thread; sched_stop ends it (in-flight streams finish
 * unless cancel_all). */
int sched_start(sched *s, ditto_err *err);
void sched_stop(sched *s, bool cancel_all);

void sched_get_stats(sched *s, sched_stats *out);
const engine *sched_engine(const sched *s);

#endif
