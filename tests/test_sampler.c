/* test_sampler.c — sampler_argmax against its definition (the sequential scan), on
 * random rows with ties, signed zeros, infinities and NaNs at every kind of place. */
#include <math.h>

#include "sampler.h"
#include "test.h"

static int32_t argmax_definition(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int main(void) {
    test_rng_seed(7);
    enum { N = 1100 };
    static float x[N];
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1.0f, -1.0f};
    int mismatches = 0, cases = 0;
    for (int it = 0; it < 4000; it++) {
        int n = 1 + test_rndi(it < 2000 ? 40 : N);
        /* few distinct values make ties common; specials sprinkled with some probability */
        int distinct = 1 + test_rndi(8), p_special = test_rndi(4);
        for (int i = 0; i < n; i++) {
            x[i] = (float)(test_rndi(distinct) - 4) * 0.5f;
            if (test_rndi(16) < p_special) x[i] = specials[test_rndi(7)];
        }
        if (it % 10 == 0) x[0] = NAN;
        if (it % 10 == 1) x[n - 1] = INFINITY;
        int32_t a = sampler_argmax(x, n), d = argmax_definition(x, n);
        mismatches += a != d;
        cases++;
        if (a != d && mismatches < 5) CHECK(0, "n %d case %d: argmax %d, definition %d", n, it, a, d);
    }
    CHECK(mismatches == 0, "%d of %d rows differ from the definition", mismatches, cases);
    /* a full-vocabulary row: the unique maximum anywhere, then a tie placed before it */
    static float v[151936];
    for (int i = 0; i < 151936; i++) v[i] = test_rnds();
    int at = test_rndi(151936);
    v[at] = 2.0f;
    CHECK(sampler_argmax(v, 151936) == at, "unique maximum at %d found", at);
    int before = test_rndi(at + 1);
    v[before] = 2.0f;
    CHECK(sampler_argmax(v, 151936) == before, "tie at %d and %d goes to the lower id", before, at);
    return test_summary();
}
