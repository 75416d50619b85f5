/* bench_attn.c — time of one attention call over a GQA group (src/cpu/attn*.c) at a few
 * positions, with the arena hot, for every flavour this CPU has; the flavours alternate, 9 rounds
 * of N calls each (the scalar one N/20), best round per flavour.
 *
 *   make build/libditto.a
 *   cc -std=c11 -D_GNU_SOURCE -O2 -iquote src -o build/bench_attn bench/bench_attn.c build/libditto.a -lm -pthread
 *   ./build/bench_attn [HEADS_PER_KV=8] [HEAD_DIM=128] [N=2000]
 *
 * Built with -DBENCH_ATTN_AB (bench/ab_kernel.sh --attn) it times two versions of attn_avx512.c
 * instead, attn_group_avx512_A / _B, prints B/A, and says whether B's output is bitwise equal to
 * A's at every 37th position.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/attn.h"
#include "cpu/cpu_quant.h"

#ifdef BENCH_ATTN_AB
void attn_group_avx512_A(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                         float *out, float *scratch);
void attn_group_avx512_B(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                         float *out, float *scratch);
#endif

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
    struct {
        const char *name;
        attn_fn fn;
        int div; /* calls per round: N / div */
#ifdef BENCH_ATTN_AB
    } fl[] = {{"A", attn_group_avx512_A, 1}, {"B", attn_group_avx512_B, 1}};
    const int nfl = 2;
#else
    } fl[] = {{"generic", attn_group_generic, 20}, {"avx512", attn_group_avx512, 1}}; /* the scalar one is ~20x slower */
    const int nfl = cpu_level_detect() >= CPU_AVX512 ? 2 : 1;
#endif
    const float scale = 1.0f / sqrtf((float)hd);
    printf("bench_attn: %d query heads per KV head, head dim %d, hot arena, best of 9 alternating rounds of %d calls; us "
           "per call\n\n| position |",
           ng, hd, iters);
    for (int f = 0; f < nfl; f++) printf(" %s |", fl[f].name);
    printf("%s\n|---:|", nfl == 2 ? " 2nd / 1st |" : "");
    for (int f = 0; f < nfl + (nfl == 2); f++) printf("---:|");
    printf("\n");
    for (size_t pi = 0; pi < sizeof pos / sizeof *pos; pi++) {
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < 9; r++)
            for (int f = 0; f < nfl; f++) {
                const int n = DT_MAX(1, iters / fl[f].div);
                const double t0 = time_now();
                for (int it = 0; it < n; it++) fl[f].fn(q, ng, K, V, pos[pi], hd, scale, o, s);
                best[f] = DT_MIN(best[f], (time_now() - t0) / n);
            }
        printf("| %d |", pos[pi]);
        for (int f = 0; f < nfl; f++) printf(" %.2f |", best[f] * 1e6);
        if (nfl == 2) printf(" %.3f |", best[1] / best[0]);
        printf("\n");
    }
#ifdef BENCH_ATTN_AB
    float *o2 = xaligned(sizeof(float) * (size_t)ng * hd);
    int same = 1;
    for (int p = 0; p < ctx; p += 37) {
        attn_group_avx512_A(q, ng, K, V, p, hd, scale, o, s);
        attn_group_avx512_B(q, ng, K, V, p, hd, scale, o2, s);
        if (memcmp(o, o2, sizeof(float) * (size_t)ng * hd)) same = 0;
    }
    printf("B bitwise equal to A at every 37th position: %s\n", same ? "yes" : "NO");
    free(o2);
#endif
    free(K), free(V), free(q), free(o), free(s);
    return 0;
}
