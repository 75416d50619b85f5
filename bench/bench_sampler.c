/* bench_sampler.c — time of one sampler_sample call on a full-vocabulary row, by row shape
 * and filters: flat rows (a tiny or random model: most of the vocabulary within the
 * candidate cutoff) and peaked rows (a trained large model: few candidates). Prints the
 * median of REPS calls per case, in µs.
 *
 *   make build/libditto.a
 *   cc -std=c11 -D_GNU_SOURCE -O2 -iquote src -o build/bench_sampler bench/bench_sampler.c build/libditto.a -lm
 *   ./build/bench_sampler [N_VOCAB=151936] [REPS=50]
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sampler.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int dcmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 151936, reps = argc > 2 ? atoi(argv[2]) : 50;
    if (n < 1 || reps < 1) return fprintf(stderr, "usage: bench_sampler [N_VOCAB] [REPS]\n"), 2;
    float *flat = malloc((size_t)n * sizeof *flat), *peaked = malloc((size_t)n * sizeof *peaked);
    void *scratch = malloc(sampler_scratch_bytes(n));
    double *t = malloc((size_t)reps * sizeof *t);
    uint64_t s = 88172645463325252ull;
    for (int i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float u = (float)(s >> 40) / 16777216.0f; /* [0, 1) */
        flat[i] = 4.0f * u - 2.0f;
        peaked[i] = 40.0f * u - 20.0f;
    }
    struct {
        const char *name;
        const float *row;
        float temp, top_p;
        int top_k;
    } cases[] = {
        {"flat, T 1", flat, 1.0f, 1.0f, 0},         {"flat, T 1, top_k 40", flat, 1.0f, 1.0f, 40},
        {"flat, T 0.7, top_p 0.9", flat, 0.7f, 0.9f, 0}, {"peaked, T 1", peaked, 1.0f, 1.0f, 0},
        {"peaked, T 0.7, top_p 0.9", peaked, 0.7f, 0.9f, 0}, {"greedy (T 0)", flat, 0.0f, 1.0f, 0},
    };
    printf("sampler_sample, %d-token rows, median of %d calls\n\n| row, filters | µs a call |\n|---|---:|\n", n,
           reps);
    unsigned sink = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sampler_params p;
        sampler_params_default(&p);
        p.temperature = cases[c].temp;
        p.top_p = cases[c].top_p;
        p.top_k = cases[c].top_k;
        p.seed = 42;
        for (int r = 0; r < reps; r++) {
            double t0 = now_us();
            sink += (unsigned)sampler_sample(&p, cases[c].row, n, r, scratch);
            t[r] = now_us() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, dcmp);
        printf("| %s | %.1f |\n", cases[c].name, t[reps / 2]);
    }
    printf("\n(checksum of the draws: %u)\n", sink);
    free(flat), free(peaked), free(scratch), free(t);
    return 0;
}
