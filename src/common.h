/* common.h — status type, always-on asserts, small helpers shared by every module. */
#ifndef DITTO_COMMON_H
#define DITTO_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A status for untrusted-input paths: functions return 0 on success or -1 after
 * filling err->msg with a message that names the offending field and value. */
typedef struct ditto_err {
    char msg[512];
} ditto_err;

/* Formats into err (if non-NULL) and returns -1, so callers can `return err_set(...)`. */
int err_set(ditto_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Internal invariant: stays on in release builds. */
#define DT_ASSERT(cond)                                                                  \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "ditto: assertion failed: %s (%s:%d)\n", #cond, __FILE__,    \
                    __LINE__);                                                           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* malloc/calloc that abort on exhaustion (sizes here are never attacker-controlled
 * without prior validation). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
/* 64-byte aligned allocation, zeroed; free with free(). */
void *xaligned(size_t n);

double time_now(void); /* monotonic seconds */

/* On a terminal (stderr is a tty): "\rLABEL  NN% [####....]", a newline at done == total.
 * Elsewhere: nothing. */
void progress_show(const char *label, uint64_t done, uint64_t total);

/* Command-line integer: s must be a whole decimal number in [lo, hi]; otherwise prints
 * "ditto CMD: FLAG expects an integer in LO..HI, got 'S'" and returns -1. */
int cli_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out);

/* The default --threads of serve, run and bench: the CPUs online, at most hi, at least 1. */
int cli_default_threads(int hi);

#define DT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* The bits of a float and back (memcpy: no aliasing games). */
static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
