/* bench_attn.c — time of one attention call over a GQA group (src/cpu/attn*.c) at a few
 * positions, with the arena hot, for every flavour this CPU has; best of 5 rounds of N calls.
 *
 *   make build/libditto.a
 *   cc -std=c11 -D_GNU_SOURCE -O2 -iquote src -o build/bench_attn bench/bench_attn.c build/libditto.a -lm -pthread
 *   ./build/bench_attn [HEADS_PER_KV=8] [HEAD_DIM=128] [N=2000]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "cpu/attn.h"
#include "cpu/cpu_quant.h"

/* a value in [-1, 1) from a hash of i (timing does not depend on the values) */
static float val(uint32_t i) { return (float)((i * 2654435761u) >> 16) / 32768.0f - 1.0f; }

int main(int argc, char **argv) {
    const int ng = argc > 1 ? atoi(argv[1]) : 8, hd = argc > 2 ? atoi(argv[2]) : 128, iters = argc > 3 ? atoi(argv[3]) : 2000;
    const int ctx = 2048, pos[] = {31, 160, 600, 2000};
    if (ng < 1 || ng > 64 || hd < 16 || hd % 16 || iters < 1) {
        fprintf(stderr, "usage: bench_attn [HEADS_PER_KV=8] [HEAD_DIM=128 (multiple of 16)] [N=2000]\n");
        return 2;
    }
    fp16_t *K = xaligned(sizeof(fp16_t) * (size_t)ctx * hd), *V = xaligned(sizeof(fp16_t) * (size_t)ctx * hd);
    float *q = xaligned(sizeof(float) * (size_t)ng * hd), *o = xaligned(sizeof(float) * (size_t)ng * hd);
    float *s = xaligned(sizeof(float) * attn_scratch_floats(ng, ctx - 1, hd));
    for (int p = 0; p < ctx; p++)
        for (int d = 0; d < hd; d++) {
            K[kv_k_index(p, d, hd)] = f32_to_fp16(val((uint32_t)(p * hd + d)) * 2.0f);
            V[(size_t)p * hd + d] = f32_to_fp16(val((uint32_t)(p * hd + d) + 7777777u) * 4.0f);
        }
    for (int i = 0; i < ng * hd; i++) q[i] = val((uint32_t)i + 12345u);
    const int lvl = cpu_level_detect();
    struct {
        const char *name;
        attn_fn fn;
    } fl[] = {{"generic", attn_group_generic}, {"avx512", attn_group_avx512}};
    const int nfl = lvl >= CPU_AVX512 ? 2 : 1;
    printf("bench_attn: %d query heads per KV head, head dim %d, hot arena, best of 5 x %d calls; us per call\n\n", ng, hd,
           iters);
    printf("| position |");
    for (int f = 0; f < nfl; f++) printf(" %s |", fl[f].name);
    printf("\n|---:|");
    for (int f = 0; f < nfl; f++) printf("---:|");
    printf("\n");
    for (size_t pi = 0; pi < sizeof pos / sizeof *pos; pi++) {
        printf("| %d |", pos[pi]);
        for (int f = 0; f < nfl; f++) {
            const int n = f == 0 ? DT_MAX(1, iters / 20) : iters; /* the scalar flavour is ~20x slower */
            double best = 1e30;
            for (int r = 0; r < 5; r++) {
                const double t0 = time_now();
                for (int it = 0; it < n; it++) fl[f].fn(q, ng, K, V, pos[pi], hd, 1.0f / sqrtf((float)hd), o, s);
                best = DT_MIN(best, (time_now() - t0) / n);
            }
            printf(" %.2f |", best * 1e6);
        }
        printf("\n");
    }
    free(K), free(V), free(q), free(o), free(s);
    return 0;
}
