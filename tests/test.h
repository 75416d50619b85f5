/* test.h — minimal test harness: CHECK counts, test_summary prints "N passed, N failed". */
#ifndef DITTO_TEST_H
#define DITTO_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed, test_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            test_passed++;                                                 \
        } else {                                                           \
            test_failed++;                                                 \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)

/* Directory of the shared test data (env DITTO_SHARED, default ../shared). */
static inline const char *test_shared_dir(void) {
    const char *s = getenv("DITTO_SHARED");
    return s && *s ? s : "../shared";
}

/* Seeded splitmix64 stream for test inputs (test_rng_seed first); helpers on top. */
static uint64_t test_rng_s;
static inline void test_rng_seed(uint64_t s) { test_rng_s = s; }
static inline uint64_t test_rnd(void) {
    uint64_t z = (test_rng_s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static inline int test_rndi(int n) { return (int)(test_rnd() % (uint64_t)n); }
static inline float test_rndu(void) { return (float)((test_rnd() >> 40) * (1.0 / 16777216.0)); } /* [0,1) */
static inline float test_rnds(void) { return 2.0f * test_rndu() - 1.0f; }                       /* [-1,1) */

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

#endif
