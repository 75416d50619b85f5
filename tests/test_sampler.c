/* test_sampler.c — sampler_argmax against its definition (the sequential scan), and
 * sampler_sample against its definition (candidates sorted by a comparison sort, then
 * the documented filters and draw), on random rows with ties, signed zeros, infinities
 * and NaNs at every kind of place. */
#include <math.h>
#include <stdlib.h>

#include "mathx.h"
#include "sampler.h"
#include "test.h"

static int32_t argmax_definition(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

typedef struct def_cand {
    float logit;
    int32_t id;
} def_cand;

static int def_cmp(const void *a, const void *b) {
    const def_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* sampler.c's documented behaviour, step by step, with qsort for the order. */
static int32_t sample_definition(const sampler_params *p, const float *logits, int n_vocab, int64_t position,
                                 def_cand *c) {
    int32_t top = argmax_definition(logits, n_vocab);
    if (!(p->temperature > 0.0f)) return top;
    float lmax = logits[top], inv_t = 1.0f / p->temperature;
    int n = 0;
    for (int i = 0; i < n_vocab; i++)
        if ((logits[i] - lmax) * inv_t >= -20.7232658f) c[n++] = (def_cand){logits[i], i};
    qsort(c, (size_t)n, sizeof *c, def_cmp);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double total = 0.0;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        float e = mathx_exp((c[i].logit - lmax) * inv_t);
        if (e < p->min_p) break;
        c[i].logit = e;
        total += e;
        keep = i + 1;
    }
    if (keep == 0) return top;
    n = keep;
    if (p->top_p < 1.0f) {
        double acc = 0.0, target = (double)p->top_p * total;
        int k = 0;
        while (k < n) {
            acc += c[k].logit;
            k++;
            if (acc >= target) break;
        }
        n = k;
        total = acc;
    }
    double u = sampler_uniform(p->seed, position) * total, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += c[i].logit;
        if (u < acc) return c[i].id;
    }
    return c[n - 1].id;
}

/* Random parameters and rows (few distinct values for ties, signed zeros, specials,
 * flat and peaked rows), each drawn at several positions. */
static void check_sample(void) {
    enum { N = 3000 };
    static float x[N];
    static def_cand dc[N];
    void *scratch = malloc(sampler_scratch_bytes(N));
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN};
    const float temps[] = {0.0f, 0.25f, 0.7f, 1.0f, 1.5f, 4.0f};
    const int top_ks[] = {0, 1, 2, 40, 1000};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.1f}, min_ps[] = {0.0f, 0.05f, 0.5f};
    int mismatches = 0, cases = 0, distinct_picks = 0;
    for (int it = 0; it < 1500; it++) {
        int n = 1 + test_rndi(it < 500 ? 60 : N);
        int kind = test_rndi(4), p_special = test_rndi(3) == 0 ? 1 : 0;
        for (int i = 0; i < n; i++) {
            if (kind == 0) {
                /* ties, half the rows at a 0 maximum, zeros of either sign */
                x[i] = it % 2 ? -0.5f * (float)test_rndi(3) : (float)(test_rndi(1 + test_rndi(6)) - 2) * 0.5f;
                if (x[i] == 0.0f) x[i] = test_rndi(2) ? 0.0f : -0.0f;
            } else if (kind == 1) {
                x[i] = test_rnds() * 0.01f; /* flat */
            } else if (kind == 2) {
                x[i] = test_rnds() * 30.0f; /* peaked */
            } else {
                x[i] = test_rnds() * 3.0f;
            }
            if (p_special && test_rndi(50) == 0) x[i] = specials[test_rndi(5)];
        }
        sampler_params p;
        sampler_params_default(&p);
        p.temperature = temps[test_rndi(6)];
        p.top_k = top_ks[test_rndi(5)];
        p.top_p = top_ps[test_rndi(4)];
        p.min_p = min_ps[test_rndi(3)];
        p.seed = (uint64_t)test_rndi(1 << 30) * 977u;
        int32_t first = -1;
        for (int64_t pos = 0; pos < 6; pos++) {
            int32_t a = sampler_sample(&p, x, n, pos * 131, scratch);
            int32_t d = sample_definition(&p, x, n, pos * 131, dc);
            if (first < 0) first = a;
            else if (a != first) distinct_picks++;
            mismatches += a != d;
            cases++;
            if (a != d && mismatches < 5)
                CHECK(0, "row %d (n %d, T %g, k %d, p %g, min_p %g) pos %lld: sampled %d, definition %d", it, n,
                      (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p, (long long)pos, a, d);
        }
    }
    CHECK(mismatches == 0, "%d of %d draws differ from the definition", mismatches, cases);
    CHECK(distinct_picks > 1000, "the draws vary with the position (%d varied)", distinct_picks);
    free(scratch);
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
    check_sample();
    /* a full-vocabulary flat row (most tokens are candidates), as a tiny model gives */
    static def_cand dc[151936];
    void *scratch = malloc(sampler_scratch_bytes(151936));
    for (int i = 0; i < 151936; i++) v[i] = test_rnds() * 2.0f;
    int full_mismatch = 0;
    for (int64_t pos = 0; pos < 8; pos++) {
        sampler_params p;
        sampler_params_default(&p);
        p.temperature = 1.0f;
        p.top_p = pos & 1 ? 0.9f : 1.0f;
        p.seed = 12345;
        full_mismatch += sampler_sample(&p, v, 151936, pos, scratch) != sample_definition(&p, v, 151936, pos, dc);
    }
    CHECK(full_mismatch == 0, "full-vocabulary flat rows: %d of 8 draws differ from the definition", full_mismatch);
    free(scratch);
    return test_summary();
}
