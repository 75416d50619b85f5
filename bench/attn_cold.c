/* attn_cold.c — in-process A/B of two versions of src/cpu/attn_avx512.c with the arena cold, as
 * a decode step finds it (a whole model streamed through the caches since the layer's last
 * visit), built by bench/ab_kernel.sh --attn-cold. Two threads, each running attention for its
 * half of the KV heads of one layer (as the model's attention stage does for one stream), layer
 * after layer; each side's pass over all layers starts after a 320 MiB read that evicts the
 * arena; sides alternate pass by pass, median per side. Prints ms per step and the KV read
 * rate, and whether B's outputs equal A's bitwise.
 *
 *   attn_cold CTX [ROUNDS=30] [LAYERS=48] [KV_HEADS=4] [HEADS_PER_KV=8] [HEAD_DIM=128]
 * ATTN_COLD_GAP_MIB=G: the main thread reads G MiB of other memory before each layer (untimed), as
 * the step streams a layer's weights between two attention stages (~36 MiB for the 30B geometry).
 * Defaults: the geometry of Qwen3-30B-A3B (ditto synth --preset 30b-a3b). */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "cpu/attn.h"

void attn_group_avx512_A(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                         float *out, float *scratch);
void attn_group_avx512_B(const float *q, int ng, const fp16_t *K, const fp16_t *V, int pos, int hd, float scale,
                         float *out, float *scratch);

typedef struct {
    int ctx, layers, kvh, ng, hd;
    size_t head_bytes; /* one head's K (or V) region: ctx positions */
    uint8_t *kv;       /* [layers][kvh][K, V][head_bytes] */
    float *q, *out[2][2], *scr[2]; /* out[side][thread]: [kvh][ng][hd] */
    attn_fn fn[2];
    int side, layer;
    _Atomic int gen, done, quit;
} cold;

/* Thread ith's heads of the current layer: kvh / 2 each. */
static void layer_part(cold *c, int ith) {
    const int h0 = ith * c->kvh / 2, h1 = (ith + 1) * c->kvh / 2;
    for (int h = h0; h < h1; h++) {
        const uint8_t *K = c->kv + ((size_t)c->layer * c->kvh + (size_t)h) * 2 * c->head_bytes, *V = K + c->head_bytes;
        const size_t o = (size_t)h * c->ng * c->hd;
        c->fn[c->side](c->q + o, c->ng, (const fp16_t *)(const void *)K, (const fp16_t *)(const void *)V, c->ctx - 1,
                       c->hd, 0.088f, c->out[c->side][ith] + o, c->scr[ith]);
    }
}

static void *worker(void *p) {
    cold *c = p;
    int seen = 0;
    for (;;) {
        int g;
        while ((g = c->gen) == seen && !c->quit) _mm_pause();
        if (c->quit) return NULL;
        seen = g;
        layer_part(c, 1);
        c->done++;
    }
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    cold c = {0};
    c.ctx = argc > 1 ? atoi(argv[1]) : 1024;
    const int rounds = argc > 2 ? atoi(argv[2]) : 30;
    c.layers = argc > 3 ? atoi(argv[3]) : 48;
    c.kvh = argc > 4 ? atoi(argv[4]) : 4;
    c.ng = argc > 5 ? atoi(argv[5]) : 8;
    c.hd = argc > 6 ? atoi(argv[6]) : 128;
    if (c.ctx < 1 || rounds < 1 || rounds > 1000 || c.layers < 1 || c.kvh < 2 || c.ng < 1 || c.hd < 16 ||
        c.hd % 16) {
        fprintf(stderr, "usage: attn_cold CTX [ROUNDS=30] [LAYERS=48] [KV_HEADS>=2] [HEADS_PER_KV=8] [HEAD_DIM=128]\n");
        return 2;
    }
    const size_t huge = (size_t)2 << 20;
    c.head_bytes = (size_t)c.ctx * c.hd * sizeof(fp16_t);
    const size_t kv_bytes = c.head_bytes * 2 * (size_t)c.kvh * (size_t)c.layers;
    c.kv = aligned_alloc(huge, (kv_bytes + huge - 1) & ~(huge - 1));
    DT_ASSERT(c.kv);
    madvise(c.kv, kv_bytes, MADV_HUGEPAGE);
    fp16_t *h = (fp16_t *)(void *)c.kv;
    for (size_t i = 0; i < kv_bytes / sizeof(fp16_t); i++)
        h[i] = (fp16_t)(0x3000 + (uint16_t)((i * 2654435761u >> 20) % 0x800)); /* 0.125 .. 0.5 */
    const size_t nq = (size_t)c.kvh * c.ng * c.hd;
    c.q = xaligned(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) c.q[i] = (float)(i % 13) * 0.1f - 0.6f;
    for (int t = 0; t < 2; t++) {
        c.scr[t] = xaligned(sizeof(float) * attn_scratch_floats(c.ng, c.ctx - 1, c.hd));
        for (int s = 0; s < 2; s++) c.out[s][t] = memset(xaligned(sizeof(float) * nq), 0, sizeof(float) * nq);
    }
    const size_t fb = (size_t)320 << 20;
    uint8_t *flush = aligned_alloc(huge, fb);
    DT_ASSERT(flush);
    memset(flush, 1, fb);
    c.fn[0] = attn_group_avx512_A;
    c.fn[1] = attn_group_avx512_B;
    pthread_t th;
    DT_ASSERT(pthread_create(&th, NULL, worker, &c) == 0);
    double *t[2] = {xmalloc(sizeof(double) * (size_t)rounds), xmalloc(sizeof(double) * (size_t)rounds)};
    uint64_t sink = 0;
    int same = 1;
    const char *ge = getenv("ATTN_COLD_GAP_MIB");
    const size_t gap = ge && atoi(ge) > 0 ? (size_t)atoi(ge) << 20 : 0; /* MiB; none below 1 */
    size_t gap_at = 0;
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < 2; s++) {
            for (size_t o = 0; o < fb; o += 64) sink += flush[o];
            c.side = s;
            double sum = 0;
            for (int l = 0; l < c.layers; l++) {
                c.layer = l;
                for (size_t o = 0; o < gap; o += 64) sink += flush[(gap_at + o) % fb]; /* a layer's weights */
                gap_at = (gap_at + gap) % fb;
                const double t0 = time_now();
                c.done = 0;
                c.gen++;
                layer_part(&c, 0);
                while (c.done < 1) _mm_pause();
                sum += time_now() - t0;
            }
            t[s][r] = sum;
        }
        for (int th_i = 0; th_i < 2; th_i++) /* each thread wrote its own heads */
            if (memcmp(c.out[0][th_i], c.out[1][th_i], sizeof(float) * nq)) same = 0;
    }
    c.quit = 1;
    pthread_join(th, NULL);
    printf("attn_cold: %d positions, %d layers x %d KV heads x %d query heads, head dim %d, two threads, arena "
           "cold, median of %d alternating passes (sink %u)\n",
           c.ctx, c.layers, c.kvh, c.ng, c.hd, rounds, (unsigned)(sink & 1));
    double med[2];
    for (int s = 0; s < 2; s++) {
        qsort(t[s], (size_t)rounds, sizeof(double), cmp_d);
        med[s] = t[s][rounds / 2];
        printf("  %c %.3f ms a step, KV %.1f GB/s\n", 'A' + s, med[s] * 1e3, (double)kv_bytes / med[s] / 1e9);
    }
    printf("  B/A %.3f; B bitwise equal to A: %s\n", med[1] / med[0], same ? "yes" : "NO");
    free(t[0]), free(t[1]), free(flush), free(c.kv), free(c.q);
    for (int i = 0; i < 2; i++) {
        free(c.scr[i]);
        for (int s = 0; s < 2; s++) free(c.out[s][i]);
    }
    return 0;
}
