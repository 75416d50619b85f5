/* ab_attn.c — in-process A/B of two versions of src/cpu/attn_avx512.c, built by bench/ab_attn.sh
 * with their entry points renamed attn_group_avx512_A / _B: one attention call over a GQA group at
 * a few positions, hot arena, the two sides alternating (9 rounds of N calls each, best per side),
 * then whether B's output is bitwise equal to A's at every 37th position.
 *
 *   ab_attn [HEADS_PER_KV=8] [HEAD_DIM=128] [N=2000]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/attn.h"
#include "cpu/cpu_quant.h"
void attn_group_avx512_A(const float *, int, const fp16_t *, const fp16_t *, int, int, float, float *, float *);
void attn_group_avx512_B(const float *, int, const fp16_t *, const fp16_t *, int, int, float, float *, float *);

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
    } fl[] = {{"A", attn_group_avx512_A}, {"B", attn_group_avx512_B}};
    const int nfl = 2;
    printf("ab_attn: %d query heads per KV head, head dim %d, hot arena, best of 9 x %d calls per side, alternating; us per call\n\n", ng, hd,
           iters);
    printf("| position |");
    for (int f = 0; f < nfl; f++) printf(" %s |", fl[f].name);
    printf(" B/A |\n|---:|");
    for (int f = 0; f < nfl; f++) printf("---:|");
    printf("---:|");
    printf("\n");
    for (size_t pi = 0; pi < sizeof pos / sizeof *pos; pi++) {
        printf("| %d |", pos[pi]);
        double best[2] = {1e30, 1e30};
        for (int r = 0; r < 9; r++)
            for (int f = 0; f < nfl; f++) {
                const int n = iters;
                const double t0 = time_now();
                for (int it = 0; it < n; it++) fl[f].fn(q, ng, K, V, pos[pi], hd, 1.0f / sqrtf((float)hd), o, s);
                best[f] = DT_MIN(best[f], (time_now() - t0) / n);
            }
        printf(" %.2f | %.2f | %.3f |", best[0] * 1e6, best[1] * 1e6, best[1] / best[0]);
        printf("\n");
    }
    float *o2 = xaligned(sizeof(float) * (size_t)ng * hd);
    int same = 1;
    for (int p = 0; p < ctx; p += 37) {
        attn_group_avx512_A(q, ng, K, V, p, hd, 1.0f / sqrtf((float)hd), o, s);
        attn_group_avx512_B(q, ng, K, V, p, hd, 1.0f / sqrtf((float)hd), o2, s);
        if (memcmp(o, o2, sizeof(float) * (size_t)ng * hd)) same = 0;
    }
    printf("B bitwise equal to A at every tested position: %s\n", same ? "yes" : "NO");
    free(K), free(V), free(q), free(o), free(s);
    return 0;
}
