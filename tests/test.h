/* test.h — minimal test harness: CHECK counts, test_summary prints "N passed, N failed". */
#ifndef DITTO_TEST_H
#define DITTO_TEST_H

#include <stdio.h>
#include <stdlib.h>

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

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

#endif
