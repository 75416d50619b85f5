/* test_server.c — `ditto serve` end to end: starts the real server binary
 * ($DITTO_SERVER_BIN, else $BUILD/ditto, else ./ditto) on a free port and drives it
 * over raw HTTP sockets: loading state, auth, every error case with its
 * status and error body, same text alone and under concurrency, stop strings,
 * logprobs, disconnects while queued / in prefill / in decode (streamed and not),
 * 8 streaming + 8 queued clients and a 429 past the queue, SIGTERM with a stream in
 * flight; then the official `openai` Node client (tests/server/openai.mjs; needs
 * `npm ci --prefix tests/server` once). Server logs are scanned for sanitizer reports.
 * Env: DITTO_TEST_MODEL (default models/tiny-qwen3moe-q4_k_m.gguf), DITTO_TEST_NODE=0
 * skips the Node part (counted as a failure: CI must run it). */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "test.h"

/* ---- tiny HTTP client ------------------------------------------------------------ */

typedef struct server {
    pid_t pid;
    int port;
    char log[128];
    const char *key;
} server;

typedef struct resp {
    int status;
    char *head; /* status line + headers */
    char *body;
    size_t n;
} resp;

static void resp_free(resp *r) {
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) { usleep((useconds_t)ms * 1000); }

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    struct timeval tv = {90, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Sends a request (Connection: close). key NULL: no Authorization. Returns the socket. */
static int send_req(const server *s, const char *method, const char *path, const char *key, const char *extra,
                    const char *body, size_t n) {
    int fd = connect_to(s->port);
    if (fd < 0) return -1;
    char head[1024];
    int k = snprintf(head, sizeof head,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, key ? "Authorization: Bearer " : "", key ? key : "", key ? "\r\n" : "",
                     extra ? extra : "", body ? n : 0);
    if (send_all(fd, head, (size_t)k) || (body && n && send_all(fd, body, n))) {
        close(fd);
        return -1;
    }
    return fd;
}

static char *read_all(int fd, size_t *n) {
    size_t cap = 4096, len = 0;
    char *b = xmalloc(cap);
    for (;;) {
        if (len + 4096 + 1 > cap) b = realloc(b, cap *= 2);
        ssize_t k = recv(fd, b + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    b[len] = 0;
    *n = len;
    return b;
}

static const char *find_header(const char *head, const char *name) {
    size_t L = strlen(name);
    for (const char *p = strstr(head, "\r\n"); p && p[2]; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, name, L) && p[2 + L] == ':') {
            const char *v = p + 3 + L;
            while (*v == ' ') v++;
            return v;
        }
    return NULL;
}

/* Parses raw bytes of one response (chunked bodies decoded). */
static int parse_resp(char *raw, size_t n, resp *r) {
    memset(r, 0, sizeof *r);
    char *sep = strstr(raw, "\r\n\r\n");
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    size_t hl = (size_t)(sep - raw);
    r->head = xmalloc(hl + 3);
    memcpy(r->head, raw, hl);
    memcpy(r->head + hl, "\r\n", 3);
    char *body = sep + 4;
    size_t bn = n - (size_t)(body - raw);
    const char *te = find_header(r->head, "Transfer-Encoding");
    r->body = xmalloc(bn + 1);
    if (te && !strncasecmp(te, "chunked", 7)) {
        size_t out = 0;
        char *p = body, *end = body + bn;
        while (p < end) {
            char *e;
            unsigned long sz = strtoul(p, &e, 16);
            char *crlf = strstr(p, "\r\n");
            if (!crlf || e == p) break;
            p = crlf + 2;
            if (sz == 0 || p + sz > end) break;
            memcpy(r->body + out, p, sz);
            out += sz;
            p += sz + 2;
        }
        r->n = out;
    } else {
        memcpy(r->body, body, bn);
        r->n = bn;
    }
    r->body[r->n] = 0;
    return 0;
}

/* One request with extra header lines and a body of n bytes; the response parsed into r. */
static int request_raw(const server *s, const char *method, const char *path, const char *key, const char *extra,
                       const char *body, size_t n_body, resp *r) {
    memset(r, 0, sizeof *r);
    int fd = send_req(s, method, path, key, extra, body, n_body);
    if (fd < 0) return -1;
    size_t n;
    char *raw = read_all(fd, &n);
    close(fd);
    int rc = parse_resp(raw, n, r);
    free(raw);
    return rc;
}

static int request(const server *s, const char *method, const char *path, const char *key, const char *body,
                   resp *r) {
    return request_raw(s, method, path, key, NULL, body, body ? strlen(body) : 0, r);
}

static int post(const server *s, const char *path, const char *body, resp *r) {
    return request(s, "POST", path, s->key, body, r);
}
static int get(const server *s, const char *path, resp *r) { return request(s, "GET", path, s->key, NULL, r); }

/* ---- JSON helpers -------------------------------------------------------------------- */

static cJSON *jparse(const resp *r) { return r->body ? cJSON_ParseWithLength(r->body, r->n) : NULL; }

static const char *jpath_str(const cJSON *j, const char *a, const char *b) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, a);
    if (b) x = cJSON_GetObjectItemCaseSensitive(x, b);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Text, finish_reason and completion tokens of a non-streamed or streamed response. */
typedef struct outcome {
    char *text;
    char finish[16];
    int completion_tokens, prompt_tokens;
    bool done_marker, ok;
    int status;
} outcome;

static void outcome_free(outcome *o) {
    free(o->text);
    memset(o, 0, sizeof *o);
}

static void text_add(char **t, const char *s) {
    size_t a = *t ? strlen(*t) : 0, b = strlen(s);
    *t = realloc(*t, a + b + 1);
    memcpy(*t + a, s, b + 1);
}

static void read_usage(const cJSON *j, outcome *o) {
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        o->completion_tokens = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens")->valueint;
        o->prompt_tokens = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens")->valueint;
    }
}

static void choice_text(const cJSON *c, bool delta, outcome *o) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(c, "text");
    if (!t) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, delta ? "delta" : "message");
        t = cJSON_GetObjectItemCaseSensitive(m, "content");
    }
    if (cJSON_IsString(t)) text_add(&o->text, t->valuestring);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    if (cJSON_IsString(f)) snprintf(o->finish, sizeof o->finish, "%s", f->valuestring);
}

static void parse_outcome(const resp *r, bool stream, outcome *o) {
    memset(o, 0, sizeof *o);
    o->status = r->status;
    text_add(&o->text, "");
    if (r->status != 200) return;
    if (!stream) {
        cJSON *j = jparse(r);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        if (c) {
            choice_text(c, false, o);
            read_usage(j, o);
            o->ok = true;
        }
        cJSON_Delete(j);
        return;
    }
    o->ok = true;
    for (char *p = r->body; p && *p;) {
        char *e = strstr(p, "\n\n");
        if (!e) break;
        *e = 0;
        if (!strncmp(p, "data: ", 6)) {
            if (!strcmp(p + 6, "[DONE]")) o->done_marker = true;
            else {
                cJSON *j = cJSON_Parse(p + 6);
                if (!j || cJSON_GetObjectItemCaseSensitive(j, "error")) o->ok = false;
                const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
                if (c) choice_text(c, true, o);
                read_usage(j, o);
                cJSON_Delete(j);
            }
        }
        *e = '\n';
        p = e + 2;
    }
    if (!o->done_marker) o->ok = false;
}

/* ---- server process -------------------------------------------------------------------- */

static char g_bin[4096];

static int start_server(server *s, const char *key, const char *delay_ms, const char *const *extra) {
    memset(s, 0, sizeof *s);
    s->key = key;
    snprintf(s->log, sizeof s->log, "/tmp/ditto-test-server-XXXXXX");
    int lfd = mkstemp(s->log);
    if (lfd < 0) return -1;
    const char *model = getenv("DITTO_TEST_MODEL");
    const char *argv[40] = {"ditto", "serve", "--port", "0", "--threads", "2", "-m",
                            model && *model ? model : "models/tiny-qwen3moe-q4_k_m.gguf"};
    int n = 8;
    if (key) {
        argv[n++] = "--api-key";
        argv[n++] = key;
    }
    for (int i = 0; extra && extra[i] && n < 38; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(lfd, 1);
        dup2(lfd, 2);
        if (delay_ms) setenv("DITTO_SERVE_LOAD_DELAY_MS", delay_ms, 1);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    close(lfd);
    s->pid = pid;
    for (double t0 = now_s(); now_s() - t0 < 30;) {
        FILE *f = fopen(s->log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            char *p = strstr(line, "listening on http://127.0.0.1:");
            if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        }
        if (f) fclose(f);
        if (s->port > 0) return 0;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            s->pid = 0;
            return -1;
        }
        sleep_ms(20);
    }
    return -1;
}

static bool wait_healthy(server *s, double timeout) {
    for (double t0 = now_s(); now_s() - t0 < timeout; sleep_ms(20)) {
        resp r;
        if (!request(s, "GET", "/health", NULL, NULL, &r) && r.status == 200) {
            resp_free(&r);
            return true;
        }
        resp_free(&r);
    }
    return false;
}

static void dump_log(const server *s, int tail_lines) {
    FILE *f = fopen(s->log, "r");
    if (!f) return;
    char *lines[200] = {0};
    char buf[1024];
    int n = 0;
    while (fgets(buf, sizeof buf, f)) {
        free(lines[n % 200]);
        lines[n % 200] = strdup(buf);
        n++;
    }
    fclose(f);
    int from = n > tail_lines ? n - tail_lines : 0;
    if (n - from > 200) from = n - 200;
    for (int i = from; i < n; i++) fprintf(stderr, "   | %s", lines[i % 200]);
    for (int i = 0; i < 200; i++) free(lines[i]);
}

/* Counts sanitizer reports in the server's log. */
static int sanitizer_reports(const server *s) {
    FILE *f = fopen(s->log, "r");
    if (!f) return 0;
    char buf[2048];
    int n = 0;
    while (fgets(buf, sizeof buf, f))
        if (strstr(buf, "ERROR: AddressSanitizer") || strstr(buf, "ERROR: LeakSanitizer") ||
            strstr(buf, "runtime error:") || strstr(buf, "WARNING: ThreadSanitizer"))
            n++;
    fclose(f);
    return n;
}

/* SIGTERM, wait for the exit (max timeout s). Returns the exit status, or -1. */
static int stop_server(server *s, double timeout) {
    if (!s->pid) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (double t0 = now_s(); now_s() - t0 < timeout; sleep_ms(10))
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    s->pid = 0;
    return -1;
}

static void finish_server(server *s, const char *name) {
    int rc = stop_server(s, 30);
    CHECK(rc == 0, "%s: exit status %d after SIGTERM (want 0)", name, rc);
    int san = sanitizer_reports(s);
    CHECK(san == 0, "%s: %d sanitizer report(s) in the server log", name, san);
    if (rc != 0 || san || test_failed) dump_log(s, san ? 200 : 30);
    unlink(s->log);
}

/* ---- /metrics and /slots ------------------------------------------------------------------- */

static double metric(const server *s, const char *name) {
    resp r;
    double v = -1;
    if (!get(s, "/metrics", &r) && r.status == 200) {
        size_t L = strlen(name);
        for (char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
            if (!strncmp(p, name, L) && p[L] == ' ') {
                v = strtod(p + L + 1, NULL);
                break;
            }
    }
    resp_free(&r);
    return v;
}

/* State of slot i ("free", "prefill", "decode") and the queue depth; tokens so far. */
typedef struct slotview {
    char state[16];
    int tokens, queued;
} slotview;

static int slots(const server *s, int i, slotview *v) {
    memset(v, 0, sizeof *v);
    resp r;
    int rc = -1;
    if (!get(s, "/slots", &r) && r.status == 200) {
        cJSON *j = jparse(&r);
        const cJSON *sl = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "slots"), i);
        const char *st = jpath_str(sl, "state", NULL);
        if (st) {
            snprintf(v->state, sizeof v->state, "%s", st);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(sl, "tokens");
            v->tokens = cJSON_IsNumber(t) ? t->valueint : 0;
            v->queued = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "queued"));
            rc = 0;
        }
        cJSON_Delete(j);
    }
    resp_free(&r);
    return rc;
}

static bool wait_slot(const server *s, int i, const char *state, double timeout, double *took) {
    double t0 = now_s();
    slotview v;
    while (now_s() - t0 < timeout) {
        if (!slots(s, i, &v) && !strcmp(v.state, state)) {
            if (took) *took = now_s() - t0;
            return true;
        }
        sleep_ms(2);
    }
    return false;
}

static bool wait_queued(const server *s, int n, double timeout) {
    slotview v;
    for (double t0 = now_s(); now_s() - t0 < timeout; sleep_ms(5))
        if (!slots(s, 0, &v) && v.queued == n) return true;
    return false;
}

static bool wait_metric(const server *s, const char *name, double want, double timeout) {
    for (double t0 = now_s(); now_s() - t0 < timeout; sleep_ms(10))
        if (metric(s, name) == want) return true;
    return false;
}

/* ---- error cases ------------------------------------------------------------------------------ */

/* The response is `status` with an OpenAI error body whose param (NULL: null) and code match. */
static void check_error(const char *what, const resp *r, int status, const char *param, const char *code,
                        const char *msg_has) {
    CHECK(r->status == status, "%s: status %d, want %d (%s)", what, r->status, status, r->body ? r->body : "");
    cJSON *j = jparse(r);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    CHECK(cJSON_IsObject(e), "%s: no error object in %s", what, r->body ? r->body : "");
    if (cJSON_IsObject(e)) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "type");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "param");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(e, "code");
        CHECK(cJSON_IsString(m) && cJSON_IsString(t) && p && c, "%s: error fields missing: %s", what, r->body);
        if (param) CHECK(cJSON_IsString(p) && !strcmp(p->valuestring, param), "%s: param want %s: %s", what, param, r->body);
        else CHECK(cJSON_IsNull(p), "%s: param should be null: %s", what, r->body);
        if (code) CHECK(cJSON_IsString(c) && !strcmp(c->valuestring, code), "%s: code want %s: %s", what, code, r->body);
        if (msg_has) CHECK(cJSON_IsString(m) && strstr(m->valuestring, msg_has), "%s: message lacks '%s': %s", what,
                           msg_has, r->body);
    }
    cJSON_Delete(j);
}

static void expect_error(const server *s, const char *path, const char *body, int status, const char *param,
                         const char *code, const char *msg_has) {
    resp r;
    CHECK(!post(s, path, body, &r), "%s: request failed", body);
    check_error(body, &r, status, param, code, msg_has);
    resp_free(&r);
}

static void test_errors(server *s) {
    const char *C = "/v1/chat/completions", *T = "/v1/completions";
    expect_error(s, C, "{\"messages\": [", 400, NULL, NULL, "invalid JSON");
    expect_error(s, C, "{\"messages\": []} trailing", 400, NULL, NULL, "invalid JSON");
    expect_error(s, C, "[1, 2]", 400, NULL, NULL, "JSON object");
    expect_error(s, C, "{}", 400, "messages", NULL, "messages");
    expect_error(s, C, "{\"messages\": \"hi\"}", 400, "messages", NULL, NULL);
    expect_error(s, C, "{\"messages\": [5]}", 400, "messages[0]", NULL, NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": 5, \"content\": \"x\"}]}", 400, "messages[0].role", NULL, NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", 400, "messages[0].role", NULL,
                 NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": 7}]}", 400, "messages[0].content", NULL,
                 NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": 1}]}]}", 400,
                 "messages[0].content[0].text", NULL, NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400,
                 "messages[0].content[0].type", "unsupported_parameter", "unsupported");
#define MSG "\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]"
    expect_error(s, C, "{" MSG ", \"temperature\": \"hot\"}", 400, "temperature", NULL, "temperature");
    expect_error(s, C, "{" MSG ", \"temperature\": 7}", 400, "temperature", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"top_p\": 0}", 400, "top_p", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"top_k\": 1.5}", 400, "top_k", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"min_p\": -1}", 400, "min_p", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"seed\": \"x\"}", 400, "seed", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"max_tokens\": 1.5}", 400, "max_tokens", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"max_tokens\": 0}", 400, "max_tokens", NULL, "0 is out of range [1, 2147483647]");
    expect_error(s, C, "{" MSG ", \"seed\": 1e20}", 400, "seed", NULL, NULL);
    /* a NUL inside any string is refused, not cut short; an escaped backslash before "u0000" is text */
    expect_error(s, T, "{\"prompt\": \"a\\u0000bcdef\", \"max_tokens\": 1}", 400, NULL, NULL, "u0000");
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\\u0000 there\"}]}", 400, NULL, NULL,
                 "u0000");
    {
        static const char raw0[] = "{\"prompt\": \"ab\0cd\", \"max_tokens\": 1}"; /* a raw 0 byte, which cJSON accepts */
        resp r0;
        CHECK(!request_raw(s, "POST", T, s->key, NULL, raw0, sizeof raw0 - 1, &r0), "raw NUL: response parsed");
        check_error("raw NUL in a string", &r0, 400, NULL, NULL, "NUL");
        resp_free(&r0);
    }
    /* a user turn needs content; an assistant turn may come without */
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0].content", NULL, "required");
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": null}]}", 400, "messages[0].content", NULL,
                 NULL);
    expect_error(s, C, "{\"messages\": [{\"role\": \"user\", \"content\": []}]}", 400, "messages[0].content", NULL,
                 NULL);
    expect_error(s, C, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages[0].role", NULL, "developer");
    {
        const char *ok[][2] = {
            {T, "{\"prompt\": \"a\\\\u0000\", \"max_tokens\": 1}"},
            {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\"}], \"max_tokens\": 1}"},
        };
        for (int i = 0; i < 2; i++) {
            resp r;
            CHECK(!post(s, ok[i][0], ok[i][1], &r) && r.status == 200, "%s: status %d, want 200 (%s)", ok[i][1], r.status,
                  r.body ? r.body : "");
            resp_free(&r);
        }
    }
    expect_error(s, C, "{" MSG ", \"max_completion_tokens\": \"9\"}", 400, "max_completion_tokens", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"stream\": \"yes\"}", 400, "stream", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"stream_options\": {\"include_usage\": 1}}", 400, "stream_options.include_usage",
                 NULL, NULL);
    expect_error(s, C, "{" MSG ", \"stop\": 5}", 400, "stop", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"stop\": [\"a\", 5]}", 400, "stop[1]", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"stop\": [\"\"]}", 400, "stop[0]", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"n\": 2}", 400, "n", "unsupported_parameter", "unsupported");
    expect_error(s, C, "{" MSG ", \"logprobs\": \"yes\"}", 400, "logprobs", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"top_logprobs\": 2}", 400, "top_logprobs", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"logprobs\": true, \"top_logprobs\": 99}", 400, "top_logprobs", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"enable_thinking\": 1}", 400, "enable_thinking", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"chat_template_kwargs\": {\"enable_thinking\": \"no\"}}", 400,
                 "chat_template_kwargs.enable_thinking", NULL, NULL);
    expect_error(s, C, "{" MSG ", \"presence_penalty\": 0.5}", 400, "presence_penalty", "unsupported_parameter", NULL);
    expect_error(s, C, "{" MSG ", \"tools\": [{\"type\": \"function\"}]}", 400, "tools", "unsupported_parameter", NULL);
    expect_error(s, T, "{\"prompt\": {}}", 400, "prompt", NULL, NULL);
    expect_error(s, T, "{\"prompt\": \"\"}", 400, "prompt", NULL, NULL);
    expect_error(s, T, "{\"prompt\": [1, 99999999]}", 400, "prompt[1]", NULL, NULL);
    expect_error(s, T, "{\"prompt\": [1, -2]}", 400, "prompt[1]", NULL, NULL);
    expect_error(s, T, "{\"prompt\": [\"a\", \"b\"]}", 400, "prompt", "unsupported_parameter", NULL);
    expect_error(s, T, "{\"prompt\": \"x\", \"echo\": true}", 400, "echo", "unsupported_parameter", NULL);
    expect_error(s, T, "{\"prompt\": \"x\", \"logprobs\": true}", 400, "logprobs", NULL, NULL);
    /* context: the server runs with --ctx 1024 */
    expect_error(s, T, "{\"prompt\": \"In the beginning\", \"max_tokens\": 1022}", 400, "max_tokens",
                 "context_length_exceeded", "1025");
    expect_error(s, T, "{\"prompt\": \"In the beginning\", \"max_tokens\": 1022}", 400, "max_tokens",
                 "context_length_exceeded", "1024");
    {
        char body[16384];
        int k = snprintf(body, sizeof body, "{\"prompt\": [");
        for (int i = 0; i < 1100; i++) k += snprintf(body + k, sizeof body - (size_t)k, "%s785", i ? "," : "");
        snprintf(body + k, sizeof body - (size_t)k, "]}");
        expect_error(s, T, body, 400, "prompt", "context_length_exceeded", "1100");
    }
    resp r;
    /* exactly at the cap is fine: 3 + 1021 = 1024 */
    CHECK(!post(s, T, "{\"prompt\": \"In the beginning\", \"max_tokens\": 1021, \"stop\": \" \"}", &r) &&
              r.status == 200,
          "prompt + max_tokens == ctx: status %d", r.status);
    resp_free(&r);
    /* routes and methods */
    CHECK(!get(s, "/v1/nothing", &r), "404 request");
    check_error("unknown route", &r, 404, NULL, "not_found", NULL);
    resp_free(&r);
    CHECK(!get(s, "/v1/chat/completions", &r), "405 request");
    check_error("GET on a POST route", &r, 405, NULL, "method_not_allowed", NULL);
    CHECK(r.head && find_header(r.head, "Allow") && !strncmp(find_header(r.head, "Allow"), "POST", 4),
          "405 names the allowed method");
    resp_free(&r);
    CHECK(!post(s, "/health", "{}", &r), "405 request");
    check_error("POST on /health", &r, 405, NULL, "method_not_allowed", NULL);
    resp_free(&r);
    CHECK(!get(s, "/v1/models/nope", &r), "model 404 request");
    check_error("unknown model", &r, 404, "model", "model_not_found", NULL);
    resp_free(&r);
    /* auth: missing, wrong, right; /health stays public */
    CHECK(!request(s, "GET", "/v1/models", NULL, NULL, &r), "401 request");
    check_error("no API key", &r, 401, NULL, "invalid_api_key", NULL);
    CHECK(r.head && find_header(r.head, "WWW-Authenticate"), "401 carries WWW-Authenticate");
    resp_free(&r);
    CHECK(!request(s, "POST", "/v1/chat/completions", "wrong", "{}", &r), "401 request");
    check_error("wrong API key", &r, 401, NULL, "invalid_api_key", NULL);
    resp_free(&r);
    CHECK(!request(s, "GET", "/v1/models", "sekret-test-key-but-longer", NULL, &r), "401 request");
    check_error("longer API key", &r, 401, NULL, "invalid_api_key", NULL);
    resp_free(&r);
    CHECK(!request(s, "GET", "/metrics", NULL, NULL, &r) && r.status == 401, "/metrics needs the key");
    resp_free(&r);
    CHECK(!request(s, "GET", "/health", NULL, NULL, &r) && r.status == 200, "/health is public: %d", r.status);
    resp_free(&r);
    /* 400: two Content-Length headers that disagree (the request's framing is unknown) */
    static const char b2[] = "{\"prompt\": \"In the beginning\", \"max_tokens\": 1}";
    CHECK(!request_raw(s, "POST", "/v1/completions", s->key, "Content-Length: 2\r\n", b2, sizeof b2 - 1, &r),
          "conflicting lengths: response parsed");
    check_error("conflicting Content-Length", &r, 400, NULL, NULL, "Content-Length");
    resp_free(&r);
    /* 413: a body over 1 MiB, sent whole (no Expect) */
    size_t big = (1 << 20) + 100;
    char *body = xmalloc(big + 1);
    memset(body, ' ', big);
    memcpy(body, "{\"prompt\": \"", 12);
    memcpy(body + big - 2, "\"}", 2);
    body[big] = 0;
    CHECK(!request_raw(s, "POST", "/v1/completions", s->key, NULL, body, big, &r), "413 response parsed");
    check_error("body over 1 MiB", &r, 413, NULL, "request_too_large", NULL);
    resp_free(&r);
    /* and with Expect: 100-continue the answer comes before the body is sent */
    int fd = connect_to(s->port);
    if (fd >= 0) {
        char head[512];
        int k = snprintf(head, sizeof head,
                         "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                         "Expect: 100-continue\r\nContent-Length: %zu\r\n\r\n",
                         s->key, big);
        send_all(fd, head, (size_t)k);
        size_t n;
        char *raw = read_all(fd, &n);
        close(fd);
        CHECK(!parse_resp(raw, n, &r) && r.status == 413, "413 before a 100-continue body: %d", r.status);
        resp_free(&r);
        free(raw);
    }
    free(body);
    /* the error counters moved */
    CHECK(metric(s, "ditto_rejections_total{reason=\"invalid_request\"}") >= 30, "invalid_request rejections counted");
    CHECK(metric(s, "ditto_rejections_total{reason=\"context_length_exceeded\"}") == 3, "context rejections counted");
    CHECK(metric(s, "ditto_rejections_total{reason=\"unauthorized\"}") == 4, "unauthorized rejections counted");
    CHECK(metric(s, "ditto_rejections_total{reason=\"body_too_large\"}") == 2, "413s counted");
}

/* ---- same text alone and together --------------------------------------------------------------- */

typedef struct job {
    const server *s;
    const char *path;
    char body[1024];
    bool stream;
    outcome out;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    resp r;
    if (post(j->s, j->path, j->body, &r)) {
        memset(&j->out, 0, sizeof j->out);
        return NULL;
    }
    parse_outcome(&r, j->stream, &j->out);
    resp_free(&r);
    return NULL;
}

static void run_jobs(job *jobs, int n) {
    pthread_t *t = xcalloc((size_t)n, sizeof *t);
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, run_job, &jobs[i]);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(t);
}

static const char *const prompts[] = {"In the beginning", "The hacker", "A fortune cookie says", "And God said",
                                      "Jargon File:", "Blessed are the", "Unix is", "Love thy neighbour"};

static void make_job(job *j, const server *s, int i, bool stream) {
    j->s = s;
    j->stream = stream;
    const char *samp = i % 2 ? "\"temperature\": 0.9, \"top_p\": 0.9, \"top_k\": 40, \"seed\": 77"
                             : "\"temperature\": 0";
    if (i % 4 < 2) {
        j->path = "/v1/completions";
        snprintf(j->body, sizeof j->body, "{\"prompt\": \"%s\", \"max_tokens\": 40, %s, \"stream\": %s}", prompts[i],
                 samp, stream ? "true" : "false");
    } else {
        j->path = "/v1/chat/completions";
        snprintf(j->body, sizeof j->body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 40, %s, \"stream\": %s}",
                 prompts[i], samp, stream ? "true" : "false");
    }
}

static void test_same_bytes(server *s) {
    enum { N = 8 };
    job solo[N], together[N];
    for (int i = 0; i < N; i++) {
        make_job(&solo[i], s, i, false);
        run_job(&solo[i]);
        CHECK(solo[i].out.ok && solo[i].out.completion_tokens > 0, "solo job %d: status %d", i, solo[i].out.status);
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) make_job(&together[i], s, i, (i + round) % 2 == 1);
        run_jobs(together, N);
        for (int i = 0; i < N; i++) {
            CHECK(together[i].out.ok, "concurrent job %d (stream %d) failed: status %d", i, together[i].stream,
                  together[i].out.status);
            CHECK(!strcmp(together[i].out.text, solo[i].out.text), "job %d: concurrent text differs from solo:\n  [%s]\n  [%s]",
                  i, together[i].out.text, solo[i].out.text);
            CHECK(!strcmp(together[i].out.finish, solo[i].out.finish), "job %d: finish %s vs %s", i,
                  together[i].out.finish, solo[i].out.finish);
            outcome_free(&together[i].out);
        }
    }
    /* a stop string that straddles tokens: the text stops right before it */
    const char *full = solo[0].out.text;
    if (strlen(full) > 20) {
        char stop[16];
        snprintf(stop, sizeof stop, "%.7s", full + 5);
        const char *at = strstr(full, stop);
        for (int stream = 0; stream < 2; stream++) {
            job j;
            make_job(&j, s, 0, stream);
            snprintf(j.body, sizeof j.body,
                     "{\"prompt\": \"%s\", \"max_tokens\": 40, \"temperature\": 0, \"stop\": [\"zzzz\", \"%s\"], "
                     "\"stream\": %s, \"stream_options\": {\"include_usage\": true}}",
                     prompts[0], stop, stream ? "true" : "false");
            run_job(&j);
            CHECK(j.out.ok && (size_t)strlen(j.out.text) == (size_t)(at - full) && !strncmp(j.out.text, full, (size_t)(at - full)),
                  "stop '%s' (stream %d): got [%s] from [%s]", stop, stream, j.out.text, full);
            CHECK(!strcmp(j.out.finish, "stop"), "stop string: finish_reason %s", j.out.finish);
            CHECK(j.out.completion_tokens > 0 && j.out.completion_tokens < 40, "stop string usage %d",
                  j.out.completion_tokens);
            outcome_free(&j.out);
        }
    }
    for (int i = 0; i < N; i++) outcome_free(&solo[i].out);
    /* logprobs are the same alone and in company */
    job lp[4];
    for (int i = 0; i < 4; i++) {
        lp[i].s = s;
        lp[i].stream = false;
        lp[i].path = "/v1/chat/completions";
        snprintf(lp[i].body, sizeof lp[i].body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 8, \"temperature\": 0, "
                 "\"logprobs\": true, \"top_logprobs\": 2}",
                 prompts[i]);
    }
    resp a, b;
    CHECK(!post(s, lp[0].path, lp[0].body, &a) && a.status == 200, "logprobs solo");
    pthread_t t[3];
    for (int i = 1; i < 4; i++) pthread_create(&t[i - 1], NULL, run_job, &lp[i]);
    CHECK(!post(s, lp[0].path, lp[0].body, &b) && b.status == 200, "logprobs together");
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    for (int i = 1; i < 4; i++) outcome_free(&lp[i].out);
    cJSON *ja = jparse(&a), *jb = jparse(&b);
    const cJSON *la = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(ja, "choices"), 0), "logprobs");
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(jb, "choices"), 0), "logprobs");
    char *sa = la ? cJSON_PrintUnformatted(la) : NULL, *sb = lb ? cJSON_PrintUnformatted(lb) : NULL;
    CHECK(sa && sb && !strcmp(sa, sb) && strstr(sa, "\"top_logprobs\""), "logprobs differ alone vs together:\n%s\n%s",
          sa ? sa : "-", sb ? sb : "-");
    free(sa);
    free(sb);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    resp_free(&a);
    resp_free(&b);
}

/* ---- 8 streaming + 8 queued, then a 429 ----------------------------------------------------------- */

static void test_load(server *s) {
    enum { N = 16 };
    job jobs[N];
    char ref[2][8192];
    for (int k = 0; k < 2; k++) { /* the reference texts, alone */
        job j;
        j.s = s;
        j.stream = false;
        j.path = "/v1/completions";
        snprintf(j.body, sizeof j.body, "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true}",
                 prompts[k], k ? 24 : 120);
        run_job(&j);
        snprintf(ref[k], sizeof ref[k], "%s", j.out.text);
        outcome_free(&j.out);
    }
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        jobs[i].s = s;
        jobs[i].stream = true;
        jobs[i].path = "/v1/completions";
        /* the first 8 hold the slots long enough for the queue to fill */
        snprintf(jobs[i].body, sizeof jobs[i].body,
                 "{\"prompt\": \"%s\", \"max_tokens\": %d, \"temperature\": 0, \"ignore_eos\": true, \"stream\": true}",
                 prompts[i < 8 ? 0 : 1], i < 8 ? 120 : 24);
        pthread_create(&t[i], NULL, run_job, &jobs[i]);
        if (i == 7) CHECK(wait_metric(s, "ditto_slots_active", 8, 20), "8 streams hold the 8 slots");
    }
    CHECK(wait_metric(s, "ditto_queue_depth", 8, 20), "8 more wait in the queue");
    resp r;
    CHECK(!post(s, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 4}", &r), "429 request");
    check_error("queue full", &r, 429, NULL, "queue_full", NULL);
    CHECK(r.head && find_header(r.head, "Retry-After"), "429 carries Retry-After");
    resp_free(&r);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        ok += jobs[i].out.ok && jobs[i].out.done_marker;
        CHECK(!strcmp(jobs[i].out.text, ref[i < 8 ? 0 : 1]), "load job %d: text differs from its solo run", i);
        outcome_free(&jobs[i].out);
    }
    CHECK(ok == N, "%d of %d streaming clients completed", ok, N);
    CHECK(metric(s, "ditto_rejections_total{reason=\"queue_full\"}") == 1, "queue_full counted");
    CHECK(wait_metric(s, "ditto_requests_in_flight", 0, 5), "nothing left in flight");
}

/* ---- disconnects -------------------------------------------------------------------------------------- */

static char *long_prompt_body(int n, bool stream) {
    size_t cap = (size_t)n * 8 + 256;
    char *b = xmalloc(cap);
    size_t k = (size_t)snprintf(b, cap, "{\"prompt\": [");
    for (int i = 0; i < n; i++) k += (size_t)snprintf(b + k, cap - k, "%s%d", i ? "," : "", 100 + (i * 37) % 5000);
    snprintf(b + k, cap - k, "], \"max_tokens\": 4, \"temperature\": 0, \"stream\": %s}", stream ? "true" : "false");
    return b;
}

/* Reads from fd until `needle` shows up (or timeout). */
static bool read_until(int fd, const char *needle, double timeout) {
    char buf[8192];
    size_t n = 0;
    struct timeval tv = {0, 50 * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (double t0 = now_s(); now_s() - t0 < timeout;) {
        ssize_t k = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (k == 0) return false;
        if (k > 0) {
            n += (size_t)k;
            buf[n] = 0;
            if (strstr(buf, needle)) return true;
            if (n > sizeof buf / 2) { /* keep the tail */
                memmove(buf, buf + n - 256, 256);
                n = 256;
            }
        }
    }
    return false;
}

static void test_disconnects(server *s) {
    const char *T = "/v1/completions";
    double took;
    char *longs = long_prompt_body(3000, true), *longn = long_prompt_body(3000, false);
    /* A: a long prompt holds the only slot in prefill; B waits in the queue */
    int a = send_req(s, "POST", T, NULL, NULL, longs, strlen(longs));
    CHECK(a >= 0 && wait_slot(s, 0, "prefill", 20, NULL), "long prompt: slot 0 in prefill");
    const char *shortb = "{\"prompt\": \"In the beginning\", \"max_tokens\": 8, \"stream\": true}";
    int b = send_req(s, "POST", T, NULL, NULL, shortb, strlen(shortb));
    CHECK(b >= 0 && wait_queued(s, 1, 10), "second request queued");
    close(b); /* disconnect while queued */
    CHECK(wait_queued(s, 0, 5), "queued request gone after its client left");
    CHECK(wait_metric(s, "ditto_disconnects_total{phase=\"queued\"}", 1, 5), "disconnect while queued counted");
    slotview v;
    CHECK(!slots(s, 0, &v) && !strcmp(v.state, "prefill"), "the prefilling stream is unaffected (%s)", v.state);
    close(a); /* disconnect in prefill */
    CHECK(wait_slot(s, 0, "free", 5, &took), "slot free after a disconnect in prefill");
    printf("   disconnect in prefill: slot free after %.1f ms\n", took * 1e3);
    CHECK(wait_metric(s, "ditto_disconnects_total{phase=\"prefill\"}", 1, 5), "disconnect in prefill counted");
    /* the same for a non-streaming request */
    a = send_req(s, "POST", T, NULL, NULL, longn, strlen(longn));
    CHECK(a >= 0 && wait_slot(s, 0, "prefill", 20, NULL), "long prompt (non-streaming): slot 0 in prefill");
    close(a);
    CHECK(wait_slot(s, 0, "free", 5, &took), "slot free after a non-streaming disconnect in prefill");
    CHECK(wait_metric(s, "ditto_disconnects_total{phase=\"prefill\"}", 2, 5), "second prefill disconnect counted");
    /* decode, streamed: read the first token, then leave */
    const char *endless = "{\"prompt\": \"In the beginning\", \"max_tokens\": 3000, \"ignore_eos\": true, \"stream\": true}";
    int c = send_req(s, "POST", T, NULL, NULL, endless, strlen(endless));
    CHECK(c >= 0 && read_until(c, "\"text\"", 20), "streamed tokens arrive");
    CHECK(wait_slot(s, 0, "decode", 5, NULL), "slot 0 in decode");
    close(c);
    CHECK(wait_slot(s, 0, "free", 5, &took), "slot free after a disconnect in decode");
    printf("   disconnect in decode (stream): slot free after %.1f ms\n", took * 1e3);
    CHECK(wait_metric(s, "ditto_disconnects_total{phase=\"decode\"}", 1, 5), "disconnect in decode counted");
    /* decode, not streamed: the handler is blocked waiting; the hang-up still cancels */
    const char *endless_n = "{\"prompt\": \"In the beginning\", \"max_tokens\": 3000, \"ignore_eos\": true}";
    int d = send_req(s, "POST", T, NULL, NULL, endless_n, strlen(endless_n));
    bool decoding = false;
    for (double t0 = now_s(); d >= 0 && now_s() - t0 < 20 && !decoding; sleep_ms(5))
        decoding = !slots(s, 0, &v) && !strcmp(v.state, "decode") && v.tokens > 2;
    CHECK(decoding, "non-streaming request decoding (%s, %d tokens)", v.state, v.tokens);
    close(d);
    CHECK(wait_slot(s, 0, "free", 5, &took), "slot free after a non-streaming disconnect in decode");
    printf("   disconnect in decode (non-stream): slot free after %.1f ms\n", took * 1e3);
    CHECK(wait_metric(s, "ditto_disconnects_total{phase=\"decode\"}", 2, 5), "second decode disconnect counted");
    CHECK(wait_metric(s, "ditto_requests_total{endpoint=\"completions\",outcome=\"disconnect\"}", 5, 5),
          "5 requests counted with outcome disconnect");
    CHECK(wait_metric(s, "ditto_requests_in_flight", 0, 5), "nothing in flight");
    /* and the server still serves */
    resp r;
    CHECK(!post(s, T, "{\"prompt\": \"In the beginning\", \"max_tokens\": 4}", &r) && r.status == 200,
          "a request after the disconnects: %d", r.status);
    resp_free(&r);
    free(longs);
    free(longn);
}

/* ---- malformed input never crashes ---------------------------------------------------------------------- */

typedef struct fuzz_arg {
    const server *s;
    int first, count;
    int bad_status, bad_body, done, ok;
} fuzz_arg;

static const char *const fuzz_templates[] = {
    "\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
    "[{\"type\": \"text\", \"text\": \"Hello \\u00e9\\ud83d\\ude00\"}]}], \"temperature\": 0.5, \"top_p\": 0.9, "
    "\"top_k\": 5, \"min_p\": 0.1, \"seed\": 3, \"stop\": [\"a\", \"\\n\"], \"logprobs\": true, \"top_logprobs\": 2}",
    "\"prompt\": [785, 3460, 315, 1], \"stream\": true, \"stream_options\": {\"include_usage\": true}, "
    "\"logprobs\": 3, \"stop\": \"the\"}",
    "\"messages\": [{\"role\": \"assistant\", \"content\": null, \"reasoning_content\": \"x\"}, {\"role\": \"tool\", "
    "\"content\": \"42\"}], \"chat_template_kwargs\": {\"enable_thinking\": false}, \"n\": 1, \"stream\": true}",
    "\"prompt\": \"In the beginning\", \"temperature\": 0, \"ignore_eos\": true, \"echo\": false, \"suffix\": null}",
};

static uint64_t fuzz_rng(uint64_t *st) {
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    return *st >> 33;
}

static void *fuzz_worker(void *arg) {
    fuzz_arg *f = arg;
    static const char alphabet[] = "{}[]\",:0123456789.-+eE \\ntfu\x01\x7f\xc3\xa9\xff";
    for (int it = f->first; it < f->first + f->count; it++) {
        uint64_t st = 0x9e3779b97f4a7c15ULL * (uint64_t)(it + 1);
        int t = (int)(fuzz_rng(&st) % 4);
        const char *tmpl = fuzz_templates[t];
        size_t n = strlen(tmpl);
        char *m = xmalloc(2 * n + 64);
        memcpy(m, tmpl, n + 1);
        int edits = 1 + (int)(fuzz_rng(&st) % 4);
        for (int e = 0; e < edits && n > 0; e++) {
            size_t at = fuzz_rng(&st) % n;
            switch (fuzz_rng(&st) % 4) {
            case 0: m[at] = alphabet[fuzz_rng(&st) % (sizeof alphabet - 1)]; break;
            case 1: memmove(m + at, m + at + 1, n - at); n--; break;
            case 2: n = at; m[n] = 0; break;
            default: { /* duplicate a span */
                size_t len = DT_MIN(n - at, (size_t)(fuzz_rng(&st) % 16));
                memmove(m + at + len, m + at, n - at + 1);
                n += len;
            }
            }
        }
        /* a fixed prefix keeps any valid request short (the first duplicate key wins) */
        char *body = xmalloc(n + 64);
        int k = snprintf(body, n + 64, "{\"max_tokens\": 2, \"max_completion_tokens\": 2, %s", m);
        resp r;
        const char *path = t == 0 || t == 2 ? "/v1/chat/completions" : "/v1/completions";
        int fd = send_req(f->s, "POST", path, f->s->key, NULL, body, (size_t)k);
        size_t rn = 0;
        char *raw = fd >= 0 ? read_all(fd, &rn) : NULL;
        if (fd >= 0) close(fd);
        if (!raw || parse_resp(raw, rn, &r)) f->bad_status++;
        else {
            if (r.status != 200 && r.status != 400) {
                f->bad_status++;
                fprintf(stderr, "fuzz %d: status %d for %s\n", it, r.status, body);
            }
            bool sse = r.head && find_header(r.head, "Content-Type") &&
                       !strncmp(find_header(r.head, "Content-Type"), "text/event-stream", 17);
            if (!sse) {
                cJSON *j = jparse(&r);
                if (!j || (r.status == 400 && !cJSON_GetObjectItemCaseSensitive(j, "error"))) {
                    f->bad_body++;
                    fprintf(stderr, "fuzz %d: bad body %s\n", it, r.body);
                }
                cJSON_Delete(j);
            } else if (!strstr(r.body, "data: [DONE]")) {
                f->bad_body++;
                fprintf(stderr, "fuzz %d: unterminated stream\n", it);
            }
            f->done++;
            f->ok += r.status == 200;
            resp_free(&r);
        }
        free(raw);
        free(body);
        free(m);
    }
    return NULL;
}

static void test_fuzz(server *s, int total) {
    enum { W = 4 };
    fuzz_arg fa[W];
    pthread_t t[W];
    for (int i = 0; i < W; i++) {
        fa[i] = (fuzz_arg){s, i * (total / W), total / W, 0, 0, 0, 0};
        pthread_create(&t[i], NULL, fuzz_worker, &fa[i]);
    }
    int bs = 0, bb = 0, done = 0, ok = 0;
    for (int i = 0; i < W; i++) {
        pthread_join(t[i], NULL);
        ok += fa[i].ok;
        bs += fa[i].bad_status;
        bb += fa[i].bad_body;
        done += fa[i].done;
    }
    printf("   fuzz: %d requests, %d accepted (200), %d refused (400)\n", done, ok, done - ok);
    CHECK(bs == 0 && bb == 0 && done == total, "fuzz: %d/%d answered, %d bad statuses, %d bad bodies", done, total, bs,
          bb);
    resp r;
    CHECK(!request(s, "GET", "/health", NULL, NULL, &r) && r.status == 200, "healthy after the fuzz");
    resp_free(&r);
    CHECK(wait_metric(s, "ditto_requests_in_flight", 0, 10), "nothing in flight after the fuzz");
}

/* ---- shutdown with a stream in flight ---------------------------------------------------------------------- */

static void test_shutdown(void) {
    server s;
    char keyfile[] = "/tmp/ditto-test-key-XXXXXX";
    int kfd = mkstemp(keyfile);
    if (kfd < 0 || write(kfd, "  file-key \nignored\n", 20) != 20) CHECK(0, "key file");
    if (kfd >= 0) close(kfd);
    const char *extra[] = {"--streams", "2", "--ctx", "4096", "--grace", "1", "--api-key-file", keyfile, NULL};
    int started = start_server(&s, NULL, NULL, extra);
    unlink(keyfile);
    s.key = "file-key";
    if (started || !wait_healthy(&s, 30)) {
        CHECK(0, "shutdown server did not start");
        return;
    }
    const char *endless = "{\"prompt\": \"In the beginning\", \"max_tokens\": 4000, \"ignore_eos\": true, \"stream\": true}";
    resp r;
    CHECK(!request(&s, "GET", "/v1/models", "wrong", NULL, &r) && r.status == 401, "--api-key-file: wrong key refused");
    resp_free(&r);
    int c = send_req(&s, "POST", "/v1/completions", s.key, NULL, endless, strlen(endless));
    CHECK(c >= 0 && read_until(c, "\"text\"", 20), "stream running before SIGTERM (key from --api-key-file)");
    kill(s.pid, SIGTERM);
    sleep_ms(200);
    int probe = connect_to(s.port);
    CHECK(probe < 0, "no new connections once SIGTERM arrived");
    if (probe >= 0) close(probe);
    struct timeval tv = {30, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t n;
    char *raw = read_all(c, &n);
    close(c);
    CHECK(strstr(raw, "server_shutting_down") && strstr(raw, "data: [DONE]"),
          "the in-flight stream ends with a shutdown event and [DONE]");
    CHECK(strstr(raw, "\r\n0\r\n\r\n") != NULL, "the chunked body is terminated cleanly");
    free(raw);
    int st = 0;
    bool exited = false;
    for (double t0 = now_s(); now_s() - t0 < 30 && !exited; sleep_ms(10)) exited = waitpid(s.pid, &st, WNOHANG) == s.pid;
    CHECK(exited && WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit 0 after SIGTERM (status %d)", st);
    if (!exited) kill(s.pid, SIGKILL), waitpid(s.pid, &st, 0);
    s.pid = 0;
    int san = sanitizer_reports(&s);
    CHECK(san == 0, "shutdown server: %d sanitizer reports", san);
    if (san || !exited) dump_log(&s, 100);
    unlink(s.log);
}

/* ---- the openai Node client ------------------------------------------------------------------------------------ */

static void test_node(server *s) {
    const char *skip = getenv("DITTO_TEST_NODE");
    if (skip && !strcmp(skip, "0")) {
        CHECK(0, "DITTO_TEST_NODE=0: the openai client tests were skipped");
        return;
    }
    struct stat st;
    if (stat("tests/server/node_modules/openai/package.json", &st)) {
        CHECK(0, "the openai Node client is not installed: run `npm ci --prefix tests/server` (needs node >= 20)");
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "node tests/server/openai.mjs http://127.0.0.1:%d/v1 %s 2>&1", s->port, s->key);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run node");
    if (!p) return;
    char line[4096];
    int np = -1, nf = -1;
    while (fgets(line, sizeof line, p)) {
        printf("   node: %s", line);
        int a, b;
        if (sscanf(line, "%d passed, %d failed", &a, &b) == 2) np = a, nf = b;
    }
    int rc = pclose(p);
    CHECK(np >= 0, "node printed no summary (exit %d)", rc);
    if (np >= 0) {
        test_passed += np;
        test_failed += nf;
        CHECK(rc == 0 || nf > 0, "node exited %d", rc);
    }
}

/* ---------------------------------------------------------------------------------------------------------------- */

/* The server binary; true when it has a working `serve` command. */
static bool find_server(void) {
    const char *env = getenv("DITTO_SERVER_BIN"), *build = getenv("BUILD");
    if (env && *env) snprintf(g_bin, sizeof g_bin, "%s", env);
    else {
        snprintf(g_bin, sizeof g_bin, "%s/ditto", build && *build ? build : "build");
        if (access(g_bin, X_OK)) snprintf(g_bin, sizeof g_bin, "./ditto");
    }
    if (access(g_bin, X_OK)) return false;
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execl(g_bin, "ditto", "serve", "--help", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!find_server()) {
        CHECK(0, "%s has no working `serve` command (is api_serve_cmd wired into main.c?)", g_bin);
        return test_summary();
    }
    printf("   server binary: %s\n", g_bin);
    signal(SIGPIPE, SIG_IGN);
    double t0 = now_s();

    /* server 1: api key, 8 slots, queue of 8, ctx 1024; held in "loading" for a moment */
    server s;
    const char *extra[] = {"--streams", "8", "--max-queue", "8", "--ctx", "1024", "--quiet", NULL};
    if (start_server(&s, "sekret", "1500", extra)) {
        CHECK(0, "server did not start");
        dump_log(&s, 50);
        return test_summary();
    }
    resp r;
    CHECK(!request(&s, "GET", "/health", NULL, NULL, &r) && r.status == 503 && strstr(r.body, "loading"),
          "/health is 503 while loading (%d)", r.status);
    resp_free(&r);
    CHECK(!post(&s, "/v1/completions", "{\"prompt\": \"x\"}", &r), "request while loading");
    check_error("generation while loading", &r, 503, NULL, "model_loading", NULL);
    resp_free(&r);
    CHECK(wait_healthy(&s, 30), "/health turns 200 after loading");
    CHECK(!get(&s, "/v1/models", &r) && r.status == 200 && strstr(r.body, "\"tiny-qwen3moe-q4_k_m\""),
          "/v1/models lists the model");
    resp_free(&r);
    printf("   server up (%.1f s)\n", now_s() - t0);
    test_errors(&s);
    printf("   errors done (%.1f s)\n", now_s() - t0);
    test_same_bytes(&s);
    printf("   same bytes done (%.1f s)\n", now_s() - t0);
    test_load(&s);
    printf("   load done (%.1f s)\n", now_s() - t0);
    test_fuzz(&s, 400);
    printf("   fuzz done (%.1f s)\n", now_s() - t0);
    test_node(&s);
    printf("   node done (%.1f s)\n", now_s() - t0);
    CHECK(!get(&s, "/metrics", &r) && r.status == 200 && strstr(r.body, "# TYPE ditto_step_seconds histogram") &&
              strstr(r.body, "ditto_step_seconds_bucket{le=\"+Inf\"}") &&
              strstr(r.body, "ditto_requests_total{endpoint=\"chat_completions\",outcome=\"stop\"}") &&
              strstr(r.body, "ditto_completion_tokens_total{endpoint=\"completions\",outcome=\"length\"}"),
          "/metrics has the histogram and per-endpoint counters");
    resp_free(&r);
    finish_server(&s, "server 1");

    /* server 2: one slot, small prefill chunks: prefill lasts long enough to watch */
    const char *extra2[] = {"--streams", "1", "--max-queue", "4", "--ctx", "4096", "--prefill-chunk", "8", "--quiet", NULL};
    if (start_server(&s, NULL, NULL, extra2) || !wait_healthy(&s, 30)) {
        CHECK(0, "server 2 did not start");
        dump_log(&s, 50);
    } else {
        test_disconnects(&s);
        finish_server(&s, "server 2");
    }
    printf("   disconnects done (%.1f s)\n", now_s() - t0);
    test_shutdown();
    printf("   total %.1f s\n", now_s() - t0);
    return test_summary();
}
