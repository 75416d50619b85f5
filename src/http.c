/* http.c — libmicrohttpd in thread-per-connection mode behind the small API of
 * http.h. We create the listening socket ourselves (any host, port 0, the bound
 * port known before the daemon starts), collect each request body up to a limit,
 * and pull streamed bodies from a blocking producer. Client hang-ups are seen by
 * an epoll thread watching a duplicate of each watched connection's socket for
 * EPOLLRDHUP/EPOLLHUP, so a request blocked in a handler learns at once. */
#include "http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* Past this many bytes of an oversized body we stop draining and answer at once
 * (the connection is closed after the answer). */
#define HTTP_DRAIN_MAX ((size_t)64 << 20)

struct http_watch {
    uint64_t id;
    int fd; /* our duplicate of the connection socket */
    void (*cb)(void *);
    void *ctx;
    bool fired;
    http_server *srv;
    http_watch *next;
};

struct http_server {
    struct MHD_Daemon *d;
    int listen_fd;
    bool quiesced;
    int port;
    char url[128];
    http_opts o;
    http_handler handler;
    void *user;
    /* hang-up watcher */
    int ep, stop_fd;
    pthread_t watcher;
    bool watcher_started;
    pthread_mutex_t wmu;
    http_watch *watches;
    uint64_t next_watch;
};

struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    char method[16];
    char *path;
    http_buf body;
    size_t body_total;
    bool too_large, dispatched, responded;
    enum MHD_Result result;
};

/* ---- buffers ---------------------------------------------------------------- */

void hbuf_add(http_buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        DT_ASSERT(p);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void hbuf_puts(http_buf *b, const char *s) { hbuf_add(b, s, strlen(s)); }

void hbuf_printf(http_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        hbuf_add(b, tmp, (size_t)k);
        return;
    }
    char *big = xmalloc((size_t)k + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    hbuf_add(b, big, (size_t)k);
    free(big);
}

void hbuf_free(http_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- requests ----------------------------------------------------------------- */

void http_opts_default(http_opts *o) {
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_body = (size_t)1 << 20;
    o->idle_timeout_s = 120;
    o->max_connections = 1024;
}

const char *http_req_method(const http_req *r) { return r->method; }
const char *http_req_path(const http_req *r) { return r->path; }
const char *http_req_header(const http_req *r, const char *name) {
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}
const char *http_req_body(const http_req *r, size_t *len) {
    *len = r->body.n;
    return r->body.p ? r->body.p : "";
}
bool http_req_too_large(const http_req *r) { return r->too_large; }
http_server *http_req_server(const http_req *r) { return r->srv; }

static void add_headers(struct MHD_Response *resp, const char *const *hdrs) {
    for (int i = 0; hdrs && hdrs[i] && hdrs[i + 1]; i += 2) MHD_add_response_header(resp, hdrs[i], hdrs[i + 1]);
}

void http_respond(http_req *r, int status, const char *content_type, const char *body, size_t len,
                  const char *const *hdrs) {
    DT_ASSERT(!r->responded);
    r->responded = true;
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!resp) {
        r->result = MHD_NO;
        return;
    }
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    add_headers(resp, hdrs);
    r->result = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
}

void http_respond_abort(http_req *r) {
    DT_ASSERT(!r->responded);
    r->responded = true;
    r->result = MHD_NO;
}

typedef struct hstream {
    http_buf buf;
    size_t off;
    bool ended;
    http_produce_fn produce;
    http_finish_fn finish;
    void *ctx;
} hstream;

static ssize_t stream_read(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    hstream *h = cls;
    while (h->off == h->buf.n) {
        if (h->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        h->buf.n = h->off = 0;
        int rc = h->produce(h->ctx, &h->buf);
        if (rc < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (rc == 0) h->ended = true;
    }
    size_t k = DT_MIN(max, h->buf.n - h->off);
    memcpy(out, h->buf.p + h->off, k);
    h->off += k;
    return (ssize_t)k;
}

static void stream_free(void *cls) {
    hstream *h = cls;
    h->finish(h->ctx);
    hbuf_free(&h->buf);
    free(h);
}

void http_respond_stream(http_req *r, int status, const char *content_type, const char *const *hdrs,
                         http_produce_fn produce, http_finish_fn finish, void *ctx) {
    DT_ASSERT(!r->responded);
    r->responded = true;
    hstream *h = xcalloc(1, sizeof *h);
    h->produce = produce;
    h->finish = finish;
    h->ctx = ctx;
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, h, stream_free);
    if (!resp) {
        r->result = MHD_NO;
        stream_free(h);
        return;
    }
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    add_headers(resp, hdrs);
    r->result = MHD_queue_response(r->conn, (unsigned)status, resp);
    MHD_destroy_response(resp); /* stream_free runs when MHD lets go of it */
}

static enum MHD_Result dispatch(http_req *r) {
    r->dispatched = true;
    /* a request may legitimately stay silent for long (queued, prefilling): the idle
     * timeout applies between requests only (restored in on_completed) */
    MHD_set_connection_option(r->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    if (r->too_large) hbuf_free(&r->body);
    r->srv->handler(r->srv->user, r);
    if (!r->responded) {
        static const char msg[] = "{\"error\":{\"message\":\"no response\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        http_respond(r, 500, "application/json", msg, sizeof msg - 1, NULL);
    }
    return r->result;
}

/* Counts Content-Length headers whose value differs from the first one's. */
static enum MHD_Result count_lengths(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    const char **first = ((const char **)cls);
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) return MHD_YES;
    if (!first[0]) first[0] = value ? value : "";
    else if (strcmp(first[0], value ? value : "")) first[1] = first[0]; /* a conflict */
    return MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    http_server *s = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = xcalloc(1, sizeof *r);
        r->srv = s;
        r->conn = c;
        snprintf(r->method, sizeof r->method, "%s", method);
        size_t ul = strcspn(url, "?");
        r->path = xmalloc(ul + 1);
        memcpy(r->path, url, ul);
        r->path[ul] = 0;
        *con_cls = r;
        const char *lens[2] = {NULL, NULL};
        MHD_get_connection_values(c, MHD_HEADER_KIND, count_lengths, lens);
        if (lens[1]) { /* RFC 9112 6.3: conflicting lengths leave the framing unknown */
            r->dispatched = true;
            static const char msg[] = "{\"error\":{\"message\":\"conflicting Content-Length headers\","
                                      "\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}";
            static const char *const close_hdr[] = {"Connection", "close", NULL};
            http_respond(r, 400, "application/json", msg, sizeof msg - 1, close_hdr);
            return r->result;
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(cl, &end, 10);
            if (errno || end == cl || v > s->o.max_body) {
                r->too_large = true;
                /* the client waits for "100 Continue" before sending: answer now */
                const char *ex = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
                if ((ex && !strcasecmp(ex, "100-continue")) || v > HTTP_DRAIN_MAX) return dispatch(r);
            }
        }
        return MHD_YES;
    }
    if (r->dispatched) { /* answered early: drop whatever still arrives */
        *upload_size = 0;
        return r->result;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        r->body_total += n;
        if (!r->too_large && r->body_total > s->o.max_body) {
            r->too_large = true;
            hbuf_free(&r->body);
        }
        if (!r->too_large) hbuf_add(&r->body, upload, n);
        if (r->too_large && r->body_total > HTTP_DRAIN_MAX) return dispatch(r);
        return MHD_YES;
    }
    return dispatch(r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    http_server *s = cls;
    (void)toe;
    http_req *r = *con_cls;
    if (!r) return;
    if (r->dispatched) MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_timeout_s);
    hbuf_free(&r->body);
    free(r->path);
    free(r);
    *con_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("DITTO_HTTP_DEBUG") != NULL;
    if (!verbose) return;
    fprintf(stderr, "http: ");
    vfprintf(stderr, fmt, ap);
}

/* ---- hang-up watcher ------------------------------------------------------------ */

static void *watcher_main(void *arg) {
    http_server *s = arg;
    struct epoll_event ev[64];
    for (;;) {
        int n = epoll_wait(s->ep, ev, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            uint64_t id = ev[i].data.u64;
            if (id == 0) return NULL; /* stop */
            pthread_mutex_lock(&s->wmu);
            for (http_watch *w = s->watches; w; w = w->next)
                if (w->id == id) {
                    if (!w->fired) {
                        w->fired = true;
                        w->cb(w->ctx);
                    }
                    break;
                }
            pthread_mutex_unlock(&s->wmu);
        }
    }
}

http_watch *http_watch_hangup(http_server *s, http_req *r, void (*cb)(void *ctx), void *ctx) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci || ci->connect_fd < 0) return NULL;
    int fd = fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return NULL;
    http_watch *w = xcalloc(1, sizeof *w);
    w->fd = fd;
    w->cb = cb;
    w->ctx = ctx;
    w->srv = s;
    pthread_mutex_lock(&s->wmu);
    w->id = ++s->next_watch;
    struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLET, .data.u64 = w->id};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev)) {
        pthread_mutex_unlock(&s->wmu);
        close(fd);
        free(w);
        return NULL;
    }
    w->next = s->watches;
    s->watches = w;
    pthread_mutex_unlock(&s->wmu);
    return w;
}

void http_unwatch(http_watch *w) {
    if (!w) return;
    http_server *s = w->srv;
    pthread_mutex_lock(&s->wmu);
    for (http_watch **p = &s->watches; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    epoll_ctl(s->ep, EPOLL_CTL_DEL, w->fd, NULL);
    close(w->fd);
    pthread_mutex_unlock(&s->wmu);
    free(w);
}

/* ---- server ------------------------------------------------------------------------- */

static int open_listener(const http_opts *o, int *port, char *url, size_t url_n, ditto_err *err) {
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", o->port);
    int gai = getaddrinfo(o->host, ps, &hints, &res);
    if (gai) return err_set(err, "--host %s: %s", o->host, gai_strerror(gai));
    int fd = -1, last_errno = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (!bind(fd, a->ai_addr, a->ai_addrlen) && !listen(fd, 512)) break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return err_set(err, "cannot listen on %s port %d: %s", o->host, o->port, strerror(last_errno));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    char host[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof host);
        *port = ntohs(a6->sin6_port);
        snprintf(url, url_n, "http://[%s]:%d", host, *port);
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a4->sin_addr, host, sizeof host);
        *port = ntohs(a4->sin_port);
        snprintf(url, url_n, "http://%s:%d", host, *port);
    }
    return fd;
}

int http_server_start(http_server **out, const http_opts *o, http_handler h, void *user, ditto_err *err) {
    *out = NULL;
    http_server *s = xcalloc(1, sizeof *s);
    s->o = *o;
    s->handler = h;
    s->user = user;
    s->ep = s->stop_fd = -1;
    pthread_mutex_init(&s->wmu, NULL);
    s->listen_fd = open_listener(o, &s->port, s->url, sizeof s->url, err);
    if (s->listen_fd < 0) goto fail;
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->ep < 0 || s->stop_fd < 0) {
        err_set(err, "epoll/eventfd: %s", strerror(errno));
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->stop_fd, &ev);
    if (pthread_create(&s->watcher, NULL, watcher_main, s)) {
        err_set(err, "cannot start the hang-up watcher thread");
        goto fail;
    }
    s->watcher_started = true;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC |
                     MHD_USE_ERROR_LOG;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_access, s, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->listen_fd,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            o->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)128 << 10, MHD_OPTION_EXTERNAL_LOGGER, on_log,
                            s, MHD_OPTION_END);
    if (!s->d) {
        err_set(err, "cannot start the HTTP daemon on %s", s->url);
        goto fail;
    }
    *out = s;
    return 0;
fail:
    if (s->listen_fd >= 0) close(s->listen_fd);
    s->listen_fd = -1;
    http_server_stop(s);
    return -1;
}

int http_server_port(const http_server *s) { return s->port; }
const char *http_server_url(const http_server *s) { return s->url; }

void http_server_quiesce(http_server *s) {
    if (!s->d || s->quiesced) return;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    s->quiesced = true;
}

void http_server_stop(http_server *s) {
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d);
    if (s->watcher_started) {
        uint64_t one = 1;
        if (write(s->stop_fd, &one, sizeof one) < 0) perror("eventfd");
        pthread_join(s->watcher, NULL);
    }
    while (s->watches) { /* left by owners that never unwatched: should not happen */
        http_watch *w = s->watches;
        s->watches = w->next;
        close(w->fd);
        free(w);
    }
    if (s->ep >= 0) close(s->ep);
    if (s->stop_fd >= 0) close(s->stop_fd);
    pthread_mutex_destroy(&s->wmu);
    free(s);
}
