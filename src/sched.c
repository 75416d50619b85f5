/* sched.c — admission queue, slot lifecycle and the step loop. One mutex guards
 * the queue, the slot table and every stream's published fields; the forward
 * pass runs without it. */
#include "sched.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

struct sched_stream {
    uint64_t id;
    enum sched_state state;
    enum sched_finish finish;
    int slot;
    int32_t *prompt;
    int n_prompt, n_prefilled;
    int max_tokens;
    sampler_params sp;
    int32_t *stop;
    int n_stop;
    bool ignore_eos;
    int32_t *tokens; /* [max_tokens] */
    int n_gen, n_read;
    uint64_t *hashes; /* [max_tokens] when recording */
    bool cancel_req;
    bool notified_end;
    int refs;        /* client + scheduler (until DONE) */
    sched_on_token cb;
    void *user;
};

struct sched {
    engine *e;
    sched_opts o;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_tok;
    sched_stream **queue; /* FIFO ring of qcap */
    int q_head, q_len, qcap; /* qcap = max(max_queue, max_streams) + 1: requests are taken while slots are free */
    int n_clients;           /* streams not yet released by their clients */
    sched_stream **active; /* admitted streams in admission order */
    int n_active;
    uint64_t next_id;
    sched_stats st;
    pthread_t thread;
    bool running, stopping;
    /* step buffers (step thread only) */
    int32_t *tok, *pos, *slotv;
    uint8_t *want;
    sched_stream **row_stream;  /* per logits row */
    int32_t *row_token;
    char *scratch;              /* a sampler's scratch per host thread, scratch_bytes each */
    size_t scratch_bytes;
    int n_out;                  /* logits rows of the step being sampled */
    sched_stream **ended;       /* streams finished this step */
};

void sched_opts_default(sched_opts *o) {
    o->max_queue = 64;
    o->prefill_chunk = 64;
    o->on_step = NULL;
    o->on_step_user = NULL;
}

int sched_create(sched **out, engine *e, const sched_opts *o, ditto_err *err) {
    *out = NULL;
    int S = e->opts.max_streams;
    if (e->opts.max_rows < S)
        return err_set(err, "max rows per step (%d) must be at least max streams (%d)", e->opts.max_rows, S);
    if (o->max_queue < 0 || o->prefill_chunk < 1)
        return err_set(err, "invalid scheduler options: queue %d, prefill chunk %d", o->max_queue, o->prefill_chunk);
    sched *s = xcalloc(1, sizeof *s);
    s->e = e;
    s->o = *o;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_tok, NULL);
    s->qcap = DT_MAX(o->max_queue, S) + 1;
    s->queue = xcalloc((size_t)s->qcap, sizeof(sched_stream *));
    s->active = xcalloc((size_t)S, sizeof(sched_stream *));
    s->next_id = 1;
    int R = e->opts.max_rows;
    s->tok = xcalloc((size_t)R, sizeof(int32_t));
    s->pos = xcalloc((size_t)R, sizeof(int32_t));
    s->slotv = xcalloc((size_t)R, sizeof(int32_t));
    s->want = xcalloc((size_t)R, 1);
    s->row_stream = xcalloc((size_t)R, sizeof(sched_stream *));
    s->row_token = xcalloc((size_t)R, sizeof(int32_t));
    s->ended = xcalloc((size_t)S + (size_t)s->qcap, sizeof(sched_stream *));
    s->scratch_bytes = (sampler_scratch_bytes(e->m->hp.n_vocab) + 63) & ~(size_t)63;
    s->scratch = xmalloc(s->scratch_bytes * (size_t)DT_MIN(engine_host_threads(e), R)); /* a thread per row at most */
    *out = s;
    return 0;
}

static void stream_free(sched_stream *st) {
    free(st->prompt);
    free(st->stop);
    free(st->tokens);
    free(st->hashes);
    free(st);
}

/* Drops one reference; mu held. */
static void stream_unref(sched_stream *st) {
    if (--st->refs == 0) stream_free(st);
}

/* Marks a stream done; releases its slot. mu held. Queues it for the end callback. */
static void stream_end(sched *s, sched_stream *st, enum sched_finish f, int *n_ended) {
    if (st->slot >= 0) {
        kv_slot_release(s->e->kv, st->slot);
        st->slot = -1;
        for (int i = 0; i < s->n_active; i++)
            if (s->active[i] == st) {
                memmove(&s->active[i], &s->active[i + 1], sizeof(*s->active) * (size_t)(s->n_active - i - 1));
                s->n_active--;
                break;
            }
    }
    st->state = SCHED_DONE;
    st->finish = f;
    s->st.finished++;
    if (f == SCHED_FINISH_CANCEL) s->st.cancelled++;
    s->ended[(*n_ended)++] = st;
}

enum sched_status sched_submit(sched *s, const sched_request *r, sched_stream **out, ditto_err *err) {
    *out = NULL;
    const model_hparams *hp = &s->e->m->hp;
    if (!r->prompt || r->n_prompt < 1) return err_set(err, "prompt: must hold at least one token"), SCHED_ERR_INVALID;
    if (r->max_tokens < 1) return err_set(err, "max_tokens: must be >= 1 (got %d)", r->max_tokens), SCHED_ERR_INVALID;
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= hp->n_vocab)
            return err_set(err, "prompt: token %d at index %d is outside the vocabulary (0..%d)", r->prompt[i], i,
                           hp->n_vocab - 1),
                   SCHED_ERR_INVALID;
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop_ids))
        return err_set(err, "stop: invalid stop token list"), SCHED_ERR_INVALID;
    const sampler_params *sp = &r->sampling;
    if (!(sp->temperature >= 0.0f) || sp->top_k < 0 || !(sp->top_p > 0.0f && sp->top_p <= 1.0f) ||
        !(sp->min_p >= 0.0f && sp->min_p <= 1.0f))
        return err_set(err, "sampling: temperature %g, top_k %d, top_p %g, min_p %g out of range", sp->temperature,
                       sp->top_k, sp->top_p, sp->min_p),
               SCHED_ERR_INVALID;
    int ctx = s->e->opts.ctx;
    if ((int64_t)r->n_prompt + r->max_tokens > ctx) {
        pthread_mutex_lock(&s->mu);
        s->st.rejected_context++;
        pthread_mutex_unlock(&s->mu);
        return err_set(err,
                       "prompt (%d tokens) + max_tokens (%d) = %lld exceeds the context cap of %d tokens per stream",
                       r->n_prompt, r->max_tokens, (long long)r->n_prompt + r->max_tokens, ctx),
               SCHED_ERR_CONTEXT;
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return err_set(err, "server is shutting down"), SCHED_ERR_SHUTDOWN;
    }
    /* a request waits in the queue only when no slot is free */
    int free_slots = s->e->opts.max_streams - s->n_active - s->q_len;
    if (free_slots <= 0 && s->q_len >= s->o.max_queue) {
        s->st.rejected_queue++;
        pthread_mutex_unlock(&s->mu);
        return err_set(err, "queue full (%d waiting, %d streams busy)", s->q_len, s->n_active), SCHED_ERR_QUEUE_FULL;
    }
    sched_stream *st = xcalloc(1, sizeof *st);
    st->id = s->next_id++;
    st->slot = -1;
    st->prompt = xmalloc(sizeof(int32_t) * (size_t)r->n_prompt);
    memcpy(st->prompt, r->prompt, sizeof(int32_t) * (size_t)r->n_prompt);
    st->n_prompt = r->n_prompt;
    st->max_tokens = r->max_tokens;
    st->sp = r->sampling;
    st->n_stop = r->n_stop;
    st->stop = xmalloc(sizeof(int32_t) * (size_t)(r->n_stop + 1));
    if (r->n_stop) memcpy(st->stop, r->stop_ids, sizeof(int32_t) * (size_t)r->n_stop);
    st->ignore_eos = r->ignore_eos;
    st->tokens = xmalloc(sizeof(int32_t) * (size_t)r->max_tokens);
    if (r->record_hashes) st->hashes = xmalloc(sizeof(uint64_t) * (size_t)r->max_tokens);
    st->cb = r->on_token;
    st->user = r->user;
    st->refs = 2;
    DT_ASSERT(s->q_len < s->qcap);
    s->queue[(s->q_head + s->q_len) % s->qcap] = st;
    s->q_len++;
    s->n_clients++;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    *out = st;
    return SCHED_OK;
}

void sched_cancel(sched *s, sched_stream *st) {
    pthread_mutex_lock(&s->mu);
    if (st->state != SCHED_DONE) st->cancel_req = true;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}

static int64_t deadline_ms(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
    return 0;
}

enum sched_state sched_stream_read(sched *s, sched_stream *st, int32_t *out, int cap, int *n, int wait_ms) {
    pthread_mutex_lock(&s->mu);
    if (wait_ms > 0 && st->n_read == st->n_gen && st->state != SCHED_DONE) {
        struct timespec ts;
        deadline_ms(&ts, wait_ms);
        while (st->n_read == st->n_gen && st->state != SCHED_DONE)
            if (pthread_cond_timedwait(&s->cv_tok, &s->mu, &ts) == ETIMEDOUT) break;
    }
    int k = DT_MIN(cap, st->n_gen - st->n_read);
    if (k > 0) memcpy(out, st->tokens + st->n_read, sizeof(int32_t) * (size_t)k);
    st->n_read += k;
    *n = k;
    enum sched_state state = st->state;
    /* DONE is reported only once every token has been read */
    if (state == SCHED_DONE && st->n_read < st->n_gen) state = SCHED_DECODE;
    pthread_mutex_unlock(&s->mu);
    return state;
}

enum sched_finish sched_stream_finish(sched *s, sched_stream *st) {
    pthread_mutex_lock(&s->mu);
    enum sched_finish f = st->finish;
    pthread_mutex_unlock(&s->mu);
    return f;
}

int sched_stream_hashes(sched *s, sched_stream *st, uint64_t *out, int cap) {
    pthread_mutex_lock(&s->mu);
    int n = st->hashes ? st->n_gen : 0;
    if (out) memcpy(out, st->hashes, sizeof(uint64_t) * (size_t)DT_MIN(n, cap));
    pthread_mutex_unlock(&s->mu);
    return n;
}

int sched_stream_slot(sched *s, sched_stream *st) {
    pthread_mutex_lock(&s->mu);
    int slot = st->slot;
    pthread_mutex_unlock(&s->mu);
    return slot;
}

uint64_t sched_stream_id(const sched_stream *st) { return st->id; }

void sched_stream_release(sched *s, sched_stream *st) {
    pthread_mutex_lock(&s->mu);
    if (st->state != SCHED_DONE) st->cancel_req = true; /* nobody listens any more */
    pthread_cond_signal(&s->cv_work);
    s->n_clients--;
    stream_unref(st);
    pthread_mutex_unlock(&s->mu);
}

static bool is_stop(const sched *s, const sched_stream *st, int32_t t) {
    if (!st->ignore_eos)
        for (int i = 0; i < s->e->m->n_eog; i++)
            if (t == s->e->m->eog[i]) return true;
    for (int i = 0; i < st->n_stop; i++)
        if (t == st->stop[i]) return true;
    return false;
}

/* Callbacks for streams that ended this step, then drop the scheduler's reference. mu not held. */
static void notify_ended(sched *s, int n_ended) {
    for (int i = 0; i < n_ended; i++) {
        sched_stream *st = s->ended[i];
        if (st->cb && !st->notified_end) st->cb(st->user, st, -1, NULL, st->finish);
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < n_ended; i++) {
        s->ended[i]->notified_end = true;
        stream_unref(s->ended[i]);
    }
    pthread_cond_broadcast(&s->cv_tok);
    pthread_mutex_unlock(&s->mu);
}

/* Rows ith, ith + nth, ... of the step's logits: their hashes (where kept) and draws. */
static void sample_rows(void *ctx, int ith, int nth) {
    sched *s = ctx;
    if (ith >= s->n_out) return;
    const engine *e = s->e;
    int V = e->m->hp.n_vocab;
    void *scratch = s->scratch + (size_t)ith * s->scratch_bytes;
    for (int i = ith; i < s->n_out; i += nth) {
        sched_stream *st = s->row_stream[i];
        const float *lg = e->logits + (size_t)i * V;
        if (st->hashes) st->hashes[st->n_gen] = engine_hash_floats(lg, (size_t)V);
        s->row_token[i] = sampler_sample(&st->sp, lg, V, (int64_t)st->n_prompt + st->n_gen, scratch);
    }
}

int sched_step(sched *s, ditto_err *err) {
    engine *e = s->e;
    int n_ended = 0;
    pthread_mutex_lock(&s->mu);
    /* cancellations */
    for (int i = s->n_active - 1; i >= 0; i--)
        if (s->active[i]->cancel_req) stream_end(s, s->active[i], SCHED_FINISH_CANCEL, &n_ended);
    int cap = s->qcap, kept = 0;
    for (int i = 0; i < s->q_len; i++) {
        sched_stream *st = s->queue[(s->q_head + i) % cap];
        if (st->cancel_req)
            stream_end(s, st, SCHED_FINISH_CANCEL, &n_ended);
        else
            s->queue[(s->q_head + kept++) % cap] = st;
    }
    s->q_len = kept;
    /* admissions, FIFO */
    while (s->q_len > 0) {
        int slot = kv_slot_acquire(e->kv);
        if (slot < 0) break;
        sched_stream *st = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % cap;
        s->q_len--;
        st->slot = slot;
        st->state = SCHED_PREFILL;
        s->active[s->n_active++] = st;
        s->st.admitted++;
    }
    /* batch: every decoder one row, then prefill chunks in admission order */
    int R = e->opts.max_rows, n = 0, n_out = 0;
    for (int i = 0; i < s->n_active; i++) {
        sched_stream *st = s->active[i];
        if (st->state != SCHED_DECODE) continue;
        s->tok[n] = st->tokens[st->n_gen - 1];
        s->pos[n] = st->n_prompt + st->n_gen - 1;
        s->slotv[n] = st->slot;
        s->want[n] = 1;
        s->row_stream[n_out++] = st;
        n++;
    }
    for (int i = 0; i < s->n_active && n < R; i++) {
        sched_stream *st = s->active[i];
        if (st->state != SCHED_PREFILL) continue;
        int c = DT_MIN(DT_MIN(s->o.prefill_chunk, R - n), st->n_prompt - st->n_prefilled);
        for (int j = 0; j < c; j++) {
            int p = st->n_prefilled + j;
            s->tok[n] = st->prompt[p];
            s->pos[n] = p;
            s->slotv[n] = st->slot;
            s->want[n] = p == st->n_prompt - 1;
            if (s->want[n]) s->row_stream[n_out++] = st;
            n++;
        }
        st->n_prefilled += c;
        s->st.prompt_tokens += (uint64_t)c;
    }
    pthread_mutex_unlock(&s->mu);
    /* streams cancelled before this step hear about it now, not after the forward */
    if (n_ended) notify_ended(s, n_ended);
    n_ended = 0;
    if (n == 0) return 0;
    engine_batch b = {n, s->tok, s->pos, s->slotv, s->want};
    double t0 = time_now();
    int got = engine_forward(e, &b, err);
    double dt = time_now() - t0;
    if (s->o.on_step) s->o.on_step(s->o.on_step_user, n, dt);
    if (got != n_out) {
        if (got >= 0) err_set(err, "internal: %d logits rows for %d requested", got, n_out);
        return -1;
    }
    /* sampling needs no lock: only the step (and, through it, the host threads it runs the rows on)
     * touches admitted streams' generation; a row's draw depends on nothing but its own row */
    s->n_out = n_out;
    int n_drawn = 0; /* rows with a random draw: ~1 ms each at a 152k vocabulary; a greedy row ~0.04 ms */
    for (int i = 0; i < n_out; i++) n_drawn += s->row_stream[i]->sp.temperature > 0.0f;
    if (n_drawn > 1) engine_parallel(e, sample_rows, s);
    else sample_rows(s, 0, 1);
    size_t V = (size_t)e->m->hp.n_vocab;
    pthread_mutex_lock(&s->mu);
    s->st.steps++;
    s->st.step_seconds += dt;
    for (int i = 0; i < n_out; i++) {
        sched_stream *st = s->row_stream[i];
        int32_t t = s->row_token[i];
        st->tokens[st->n_gen++] = t;
        st->state = SCHED_DECODE;
        s->st.generated_tokens++;
        if (is_stop(s, st, t))
            stream_end(s, st, SCHED_FINISH_STOP, &n_ended);
        else if (st->n_gen == st->max_tokens)
            stream_end(s, st, SCHED_FINISH_LENGTH, &n_ended);
    }
    pthread_cond_broadcast(&s->cv_tok);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n_out; i++) {
        sched_stream *st = s->row_stream[i];
        if (st->cb)
            st->cb(st->user, st, s->row_token[i], e->logits + (size_t)i * V,
                   st->state == SCHED_DONE ? st->finish : SCHED_FINISH_NONE);
        if (st->state == SCHED_DONE) st->notified_end = true;
    }
    if (n_ended) notify_ended(s, n_ended);
    return n;
}

bool sched_idle(sched *s) {
    pthread_mutex_lock(&s->mu);
    bool idle = s->q_len == 0 && s->n_active == 0;
    pthread_mutex_unlock(&s->mu);
    return idle;
}

static void *loop(void *arg) {
    sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->q_len == 0 && s->n_active == 0 && !s->stopping) pthread_cond_wait(&s->cv_work, &s->mu);
        bool stop = s->stopping && s->q_len == 0 && s->n_active == 0;
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
        ditto_err err;
        if (sched_step(s, &err) < 0) {
            fprintf(stderr, "ditto: step failed: %s\n", err.msg);
            abort(); /* an internal invariant broke: the batch was built by us */
        }
    }
}

int sched_start(sched *s, ditto_err *err) {
    if (s->running) return 0;
    s->stopping = false;
    if (pthread_create(&s->thread, NULL, loop, s)) return err_set(err, "cannot start the scheduler thread");
    s->running = true;
    return 0;
}

void sched_stop(sched *s, bool cancel_all) {
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    if (cancel_all) {
        for (int i = 0; i < s->n_active; i++) s->active[i]->cancel_req = true;
        for (int i = 0; i < s->q_len; i++) s->queue[(s->q_head + i) % s->qcap]->cancel_req = true;
    }
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    if (s->running) pthread_join(s->thread, NULL);
    s->running = false;
}

void sched_free(sched *s) {
    if (!s) return;
    sched_stop(s, true);
    ditto_err err;
    while (!sched_idle(s))
        if (sched_step(s, &err) < 0) break;
    DT_ASSERT(s->n_clients == 0); /* every stream handle must be released first */
    free(s->queue);
    free(s->active);
    free(s->tok);
    free(s->pos);
    free(s->slotv);
    free(s->want);
    free(s->row_stream);
    free(s->row_token);
    free(s->ended);
    free(s->scratch);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_tok);
    free(s);
}

void sched_get_stats(sched *s, sched_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->active = s->n_active;
    out->queued = s->q_len;
    out->free_slots = s->e->opts.max_streams - s->e->kv->n_used;
    pthread_mutex_unlock(&s->mu);
}

const engine *sched_engine(const sched *s) { return s->e; }
