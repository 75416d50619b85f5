#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int err_set(ditto_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "ditto: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "ditto: out of memory (%zu x %zu bytes)\n", n, size);
        abort();
    }
    return p;
}

void *xaligned(size_t n) {
    size_t r = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, r ? r : 64);
    if (!p) {
        fprintf(stderr, "ditto: out of memory (%zu bytes)\n", n);
        abort();
    }
    memset(p, 0, r ? r : 64);
    return p;
}

double time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "ditto %s: %s expects an integer in %ld..%ld, got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

void progress_show(const char *label, uint64_t done, uint64_t total) {
    if (!isatty(2) || total == 0) return;
    int pct = (int)(done * 100 / total), bar = pct * 30 / 100;
    char b[31];
    for (int i = 0; i < 30; i++) b[i] = i < bar ? '#' : '.';
    b[30] = 0;
    fprintf(stderr, "\r%s %3d%% [%s]%s", label, pct, b, done >= total ? "\n" : "");
}

int cli_default_threads(int hi) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)DT_MIN(n, (long)hi);
}
