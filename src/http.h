/* http.h — HTTP/1.1 plumbing on libmicrohttpd: a listener, one thread per
 * connection, whole-body requests, buffered and streamed (chunked) responses,
 * and a hang-up watch that tells a request's owner the moment its client goes.
 *
 * Threads: the handler runs on the connection's own thread and may block (a
 * non-streaming generation waits there). A streamed body is pulled by calling the
 * producer on that same thread, which may block until it has something to send.
 * Hang-up callbacks run on the watcher thread. */
#ifndef DITTO_HTTP_H
#define DITTO_HTTP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "common.h"

typedef struct http_server http_server;
typedef struct http_req http_req;

typedef struct http_opts {
    const char *host;         /* numeric or name; "127.0.0.1" by default */
    int port;                 /* 0: any free port (see http_server_port) */
    size_t max_body;          /* bigger request bodies are drained, never stored */
    unsigned idle_timeout_s;  /* keep-alive connections idle this long are closed (0: never) */
    unsigned max_connections;
} http_opts;

void http_opts_default(http_opts *o);

/* Called once per request, after its whole body arrived (or was found too large). Must
 * answer with exactly one http_respond* call before returning. */
typedef void (*http_handler)(void *user, http_req *r);

int http_server_start(http_server **out, const http_opts *o, http_handler h, void *user, ditto_err *err);
int http_server_port(const http_server *s);
/* "http://127.0.0.1:8080" (IPv6 hosts in brackets). */
const char *http_server_url(const http_server *s);
/* Stops accepting connections; open ones are served on. */
void http_server_quiesce(http_server *s);
/* Closes every connection, waits for their threads (streams' finish callbacks have
 * run when it returns) and frees. */
void http_server_stop(http_server *s);

const char *http_req_method(const http_req *r);
const char *http_req_path(const http_req *r); /* without the query string */
const char *http_req_header(const http_req *r, const char *name); /* case-insensitive; NULL if absent */
/* The body, NUL-terminated (it may hold NUL bytes itself); *len its length. */
const char *http_req_body(const http_req *r, size_t *len);
bool http_req_too_large(const http_req *r); /* over max_body: the body was dropped */

/* A growable byte buffer (responses, SSE events). */
typedef struct http_buf {
    char *p;
    size_t n, cap;
} http_buf;
void hbuf_add(http_buf *b, const void *s, size_t n);
void hbuf_puts(http_buf *b, const char *s);
void hbuf_printf(http_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void hbuf_free(http_buf *b);

/* Buffered response. hdrs: NULL or {"Name", "Value", ..., NULL}. */
void http_respond(http_req *r, int status, const char *content_type, const char *body, size_t len,
                  const char *const *hdrs);
/* Closes the connection without a response (the client is gone anyway). */
void http_respond_abort(http_req *r);

/* Appends the next piece of a streamed body to out. Returns 1: more will follow (may
 * block until there is something, an empty out is fine), 0: that was the end, -1:
 * abort the connection. */
typedef int (*http_produce_fn)(void *ctx, http_buf *out);
/* Called exactly once when the streamed response is over, sent or not. */
typedef void (*http_finish_fn)(void *ctx);
/* Streamed response (chunked). On failure to start it, finish is called at once. */
void http_respond_stream(http_req *r, int status, const char *content_type, const char *const *hdrs,
                         http_produce_fn produce, http_finish_fn finish, void *ctx);

/* Hang-up watch on the request's connection: cb(ctx) runs once (watcher thread)
 * when the peer closes or resets it. After http_unwatch returns, cb never runs. */
typedef struct http_watch http_watch;
http_watch *http_watch_hangup(http_server *s, http_req *r, void (*cb)(void *ctx), void *ctx);
void http_unwatch(http_watch *w);
http_server *http_req_server(const http_req *r);

#endif
