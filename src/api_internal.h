/* api_internal.h — what api.c (server, routes, serve command) and api_gen.c
 * (generation requests: parsing, the text pipeline, SSE, logprobs) share. */
#ifndef DITTO_API_INTERNAL_H
#define DITTO_API_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "chat.h"
#include "common.h"
#include "engine.h"
#include "http.h"
#include "metrics.h"
#include "model.h"
#include "sched.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "models/tiny-qwen3moe-q4_k_m.gguf"
#define API_MAX_BODY ((size_t)1 << 20)
#define API_MAX_STOP 16
#define API_MAX_STOP_LEN 512
#define API_MAX_TOP_LOGPROBS 20

enum { PH_LOADING = 0, PH_READY, PH_DRAINING };
enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_CANCEL };

typedef struct serve_opts {
    const char *model_path, *host;
    int port, streams, ctx, threads, max_queue, prefill_chunk;
    char *api_key;
    bool unify, quiet;
    double grace;
} serve_opts;

typedef struct gen gen;

typedef struct api {
    serve_opts o;
    http_server *http;
    atomic_int phase; /* PH_*: the fields below are set before PH_READY is stored */
    model *m;
    tokenizer *tok;
    engine *e;
    sched *s;
    int ctx, n_vocab, n_tok_vocab;
    char model_id[256];
    long long created;
    metrics *met;
    pthread_mutex_t reg_mu; /* the registry of submitted requests */
    gen *reg;
    int n_reg;
    atomic_ullong next_id;
    uint64_t id_salt;
    /* step thread only (on_token): which logits row the current callback belongs to */
} api;

typedef struct apierr {
    int status;
    enum met_reject why;
    const char *code;
    const char *allow; /* 405 */
    char param[128];
    char msg[640];
} apierr;

/* One sampled token's log-probabilities (raw model distribution). */
typedef struct lp_entry {
    float lp;
    int32_t id;
    bool hidden; /* a control token (EOS, <|im_end|>): not part of the text */
    size_t start; /* bytes of decoded text before this token's (stop strings not yet cut) */
    int n_top;
    int32_t top_id[API_MAX_TOP_LOGPROBS];
    float top_lp[API_MAX_TOP_LOGPROBS];
} lp_entry;

struct gen {
    api *A;
    enum met_endpoint ep;
    /* request */
    int32_t *prompt;
    int n_prompt, max_tokens;
    sampler_params sp;
    bool ignore_eos, stream, include_usage;
    int top_lp; /* -1: no logprobs; else alternatives per token */
    char *stop[API_MAX_STOP];
    size_t stop_len[API_MAX_STOP];
    int n_stop;
    char id[48];
    long long created;
    double t0;
    /* scheduler side */
    sched_stream *st;
    http_watch *watch;
    atomic_bool gone;      /* the client hung up */
    atomic_int gone_phase; /* enum met_phase at the hang-up, -1 before */
    atomic_int n_seen;     /* tokens reported by on_token */
    pthread_mutex_t mu;    /* guards the three below; cv signals changes */
    pthread_cond_t cv;
    bool cb_final; /* the scheduler's last callback for this stream has run */
    int lp_ready;  /* lp[0..lp_ready) are computed */
    bool lp_bad;
    lp_entry *lp;     /* [max_tokens] when logprobs are wanted */
    /* text pipeline (the connection thread) */
    detok_stream ds;
    http_buf hold; /* decoded, not yet released: could start a stop string */
    int n_tok;     /* tokens fed */
    bool text_done, done;
    int finish;
    int lp_sent;   /* tokens whose logprobs went out (streaming) */
    size_t lp_off; /* text_offset of the next token, in characters (completions logprobs) */
    size_t pushed;   /* bytes of decoded text so far, held or released */
    size_t released; /* bytes of text released to the client (what a stop string cut never is) */
    http_buf text; /* non-streaming: the whole completion */
    /* SSE */
    bool sent_head, sse_done;
    bool completed;    /* the whole response was produced */
    bool shutdown_end; /* ended by server shutdown */
    gen *prev, *next;  /* registry */
};

int api_fail(apierr *E, int status, enum met_reject why, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void api_send_error(api *A, http_req *r, enum met_endpoint ep, const apierr *E);
void api_reply(api *A, http_req *r, int status, const char *ctype, const char *body, size_t len,
               const char *const *hdrs);
uint64_t api_random(api *A);

size_t utf8_char_len(const unsigned char *s, size_t n);
bool utf8_valid(const char *s, size_t n);
void jstr(http_buf *b, const char *s, size_t n);
void jstr_c(http_buf *b, const char *s);
void jnum(http_buf *b, double v);

/* POST /v1/chat/completions and /v1/completions (api_gen.c). */
void api_generate(api *A, http_req *r, enum met_endpoint ep);

#endif
