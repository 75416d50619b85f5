/* sampler.c — greedy / temperature / top-k / top-p / min-p with a counter RNG.
 *
 * Order of filters (documented behaviour): candidates are the tokens whose
 * probability at the given temperature is at least 1e-9 of the top token's
 * (the rest carry negligible mass); sort by (logit desc, id asc); keep top_k;
 * keep tokens with p >= min_p * p_max; keep the smallest prefix whose mass
 * reaches top_p; draw with one uniform number against the cumulative mass. */
#include "sampler.h"

#include <string.h>

#include "mathx.h"

void sampler_params_default(sampler_params *p) {
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->seed = 0;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

double sampler_uniform(uint64_t seed, int64_t position) {
    uint64_t h = splitmix64(splitmix64(seed) ^ (uint64_t)position);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* Defined as the scan `best = 0; for i: if (x[i] > x[best]) best = i`: the first index of
 * the largest value under `>` (so -0 and +0 tie, NaNs are never chosen unless x[0] is one,
 * which no later value exceeds). Computed as two passes that vectorize: the maximum over 8
 * independent lanes (`a > b ? a : b` keeps b for NaN), then the first index equal to it.
 * The scan itself was a load-compare chain of ~4 ns per entry, 0.6 ms per row at 152k. */
int32_t sampler_argmax(const float *x, int n) {
    if (n < 1 || !(x[0] == x[0])) return 0;
    float m[8];
    for (int j = 0; j < 8; j++) m[j] = x[0];
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float mx = m[0];
    for (int j = 1; j < 8; j++) mx = m[j] > mx ? m[j] : mx;
    for (i = 0; i < n; i++)
        if (x[i] == mx) return i;
    DT_ASSERT(0); /* mx is one of x[0..n) */
    return 0;
}

typedef struct cand {
    float logit;
    int32_t id;
} cand;

/* Two candidate arrays: the list and the radix sort's other buffer. */
size_t sampler_scratch_bytes(int n_vocab) { return 2 * (size_t)n_vocab * sizeof(cand); }

/* A key whose ascending unsigned order is (logit descending), with -0 and +0 equal as
 * under `>`; NaNs never reach it (the candidate filter drops them). */
static uint32_t cand_key(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b << 1) == 0) b = 0;                         /* -0 -> +0 */
    uint32_t ord = (b >> 31) ? ~b : b | 0x80000000u; /* ascending with f */
    return ~ord;
}

/* Sorts c[0..n) by (logit descending, id ascending) — the order of comparing logits
 * by `>` and ties by id — with a stable LSD radix sort on cand_key over three digits
 * (11, 11, 10 bits); c must arrive in ascending id order, so stability keeps equal
 * logits by id. tmp holds n. Returns the sorted array (c or tmp). A digit every key
 * shares is skipped. The qsort this replaced took ~10 ms a row at 152k candidates. */
static cand *cand_sort(cand *c, cand *tmp, int n) {
    enum { D0 = 11, D1 = 11, D2 = 10 };
    static const int shift[3] = {0, D0, D0 + D1}, width[3] = {D0, D1, D2};
    uint32_t hist[3][1 << 11];
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < n; i++) {
        uint32_t k = cand_key(c[i].logit);
        for (int d = 0; d < 3; d++) hist[d][(k >> shift[d]) & ((1u << width[d]) - 1)]++;
    }
    cand *src = c, *dst = tmp;
    for (int d = 0; d < 3; d++) {
        uint32_t nb = 1u << width[d], sum = 0;
        int single = 0;
        for (uint32_t b = 0; b < nb; b++) {
            if (hist[d][b] == (uint32_t)n) single = 1;
            uint32_t h = hist[d][b];
            hist[d][b] = sum;
            sum += h;
        }
        if (single) continue;
        for (int i = 0; i < n; i++) {
            uint32_t b = (cand_key(src[i].logit) >> shift[d]) & (nb - 1);
            dst[hist[d][b]++] = src[i];
        }
        cand *x = src;
        src = dst;
        dst = x;
    }
    return src;
}

int32_t sampler_sample(const sampler_params *p, const float *logits, int n_vocab, int64_t position, void *scratch) {
    if (!(p->temperature > 0.0f)) return sampler_argmax(logits, n_vocab);
    int32_t top = sampler_argmax(logits, n_vocab);
    float lmax = logits[top], inv_t = 1.0f / p->temperature;
    cand *c = scratch, *tmp = c + n_vocab;
    int n = 0;
    /* exp((l - lmax)/T) >= 1e-9  <=>  (l - lmax)/T >= ln(1e-9) */
    const float cutoff = -20.7232658f;
    for (int i = 0; i < n_vocab; i++) {
        float z = (logits[i] - lmax) * inv_t;
        if (z >= cutoff) c[n++] = (cand){logits[i], i};
    }
    c = cand_sort(c, tmp, n);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    /* probabilities relative to the top token, summed in rank order */
    double total = 0.0;
    int keep = 0;
    for (int i = 0; i < n; i++) {
        float e = mathx_exp((c[i].logit - lmax) * inv_t);
        if (e < p->min_p) break; /* p_i / p_max < min_p */
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
