/* test_attn.c — every attention flavour is bitwise equal to attn_head_generic, over
 * one and many chunks, head dims 64/128, ordinary and extreme scores. */
#include <math.h>
#include <string.h>

#include "cpu/attn.h"
#include "cpu/cpu_quant.h"
#include "cpu/vec.h"
#include "mathx.h"
#include "test.h"

static uint64_t rs = 88172645463325252ull;
static float frand(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

int main(void) {
    if (cpu_level_detect() < CPU_AVX512) {
        printf("no AVX-512 on this CPU: only the generic flavour exists\n");
        CHECK(attn_select(cpu_level_detect(), 128) == attn_group_generic, "generic selected");
        return test_summary();
    }
    /* groups of 1..9 query heads (9: more than one scores pass) sharing a KV head */
    const int ctx = 320, hds[] = {64, 128}, groups[] = {1, 2, 3, 4, 5, 8, 9};
    const int NG = 9;
    int checked = 0;
    for (int hi = 0; hi < 2; hi++) {
        int hd = hds[hi];
        fp16_t *K = xaligned(sizeof(fp16_t) * (size_t)ctx * hd), *V = xaligned(sizeof(fp16_t) * (size_t)ctx * hd);
        float *q = xaligned(sizeof(float) * (size_t)NG * hd), *a = xaligned(sizeof(float) * (size_t)NG * hd),
              *b = xaligned(sizeof(float) * (size_t)NG * hd);
        float *s1 = xaligned(sizeof(float) * attn_scratch_floats(1, ctx - 1, hd));
        float *s2 = xaligned(sizeof(float) * attn_scratch_floats(NG, ctx - 1, hd));
        for (int mode = 0; mode < 4; mode++) {
            float amp = mode == 0 ? 1.0f : mode == 1 ? 30.0f : mode == 2 ? 0.0f : 300.0f;
            for (int p = 0; p < ctx; p++)
                for (int d = 0; d < hd; d++) {
                    K[kv_k_index(p, d, hd)] = f32_to_fp16(mode == 2 ? 0.5f : frand() * (mode == 3 ? 60.0f : 2.0f));
                    V[(size_t)p * hd + d] = f32_to_fp16(frand() * 4.0f);
                }
            for (int i = 0; i < NG * hd; i++) q[i] = frand() * amp * (i / hd == 2 ? 0.1f : 1.0f);
            for (int gi = 0; gi < (int)(sizeof groups / sizeof *groups); gi++) {
                int ng = groups[gi];
                for (int pos = 0; pos < ctx; pos += (pos < 70 ? 1 + gi : 13 + gi)) {
                    float scale = 1.0f / sqrtf((float)hd);
                    for (int g = 0; g < ng; g++)
                        attn_head_generic(q + g * hd, K, V, pos, hd, scale, a + g * hd, s1);
                    memset(b, 0xff, sizeof(float) * (size_t)NG * hd);
                    attn_group_avx512(q, ng, K, V, pos, hd, scale, b, s2);
                    CHECK(memcmp(a, b, sizeof(float) * (size_t)ng * hd) == 0,
                          "hd %d mode %d group %d pos %d: avx512 != generic", hd, mode, ng, pos);
                    if (ng < NG) {
                        uint32_t guard;
                        memcpy(&guard, b + (size_t)ng * hd, 4);
                        CHECK(guard == 0xffffffffu, "group %d wrote past its heads", ng);
                    }
                    memset(b, 0xff, sizeof(float) * (size_t)NG * hd);
                    attn_group_generic(q, ng, K, V, pos, hd, scale, b, s1);
                    CHECK(memcmp(a, b, sizeof(float) * (size_t)ng * hd) == 0, "group generic != per head");
                    checked++;
                }
            }
        }
        free(K), free(V), free(q), free(a), free(b), free(s1), free(s2);
    }
    /* SwiGLU: avx512 == generic over ordinary, huge, tiny, zero, inf and NaN inputs, odd lengths */
    {
        int n = 1000;
        float *g = xaligned(sizeof(float) * (size_t)n), *u = xaligned(sizeof(float) * (size_t)n);
        float *h1 = xaligned(sizeof(float) * (size_t)n), *h2 = xaligned(sizeof(float) * (size_t)n);
        for (int i = 0; i < n; i++) {
            float amp = i % 5 == 0 ? 200.0f : i % 5 == 1 ? 1e-30f : 8.0f;
            g[i] = frand() * amp;
            u[i] = frand() * 3.0f;
        }
        g[3] = 0.0f, g[4] = -0.0f, g[7] = INFINITY, g[8] = -INFINITY, g[9] = NAN, g[10] = 88.5f, g[11] = -87.4f;
        for (int len = 1; len <= n; len += 37) {
            vec_swiglu_generic(g, u, h1, len);
            vec_swiglu_avx512(g, u, h2, len);
            CHECK(memcmp(h1, h2, sizeof(float) * (size_t)len) == 0, "swiglu length %d: avx512 != generic", len);
        }
        free(g), free(u), free(h1), free(h2);
    }
    /* RoPE: vec_rope == the scalar formula (products, then one subtraction or addition) for every
     * half-width 1..80 (partial lanes and none), ordinary and extreme values */
    {
        float v[160], w[160], cs[80], sn[80];
        int bad = 0;
        for (int half = 1; half <= 80; half++) {
            for (int i = 0; i < 2 * half; i++) v[i] = frand() * (i % 7 == 0 ? 3e37f : i % 7 == 1 ? 1e-38f : 4.0f);
            for (int i = 0; i < half; i++) cs[i] = frand(), sn[i] = frand();
            memcpy(w, v, sizeof(float) * 2 * (size_t)half);
            for (int i = 0; i < half; i++) {
                const float x0 = w[i], x1 = w[i + half];
                w[i] = (x0 * cs[i]) - (x1 * sn[i]);
                w[i + half] = (x1 * cs[i]) + (x0 * sn[i]);
            }
            vec_rope(v, cs, sn, half);
            bad += memcmp(v, w, sizeof(float) * 2 * (size_t)half) != 0;
        }
        CHECK(bad == 0, "rope: %d of 80 widths differ from the scalar formula", bad);
    }
    /* RMSNorm: avx512 == mathx_rmsnorm over lengths 1..300 (partial lanes, one and many
     * 32-lane rounds), ordinary / huge / tiny values, in place and out of place */
    {
        int n = 300;
        float *x = xaligned(sizeof(float) * (size_t)n), *w = xaligned(sizeof(float) * (size_t)n);
        float *y1 = xaligned(sizeof(float) * (size_t)n), *y2 = xaligned(sizeof(float) * (size_t)n);
        for (int mode = 0; mode < 3; mode++) {
            float amp = mode == 0 ? 3.0f : mode == 1 ? 1e18f : 1e-20f;
            for (int i = 0; i < n; i++) x[i] = frand() * amp, w[i] = frand() * 2.0f;
            for (int len = 1; len <= n; len += (len < 70 ? 1 : 23)) {
                vec_rmsnorm_generic(y1, x, w, len, 1e-6f);
                vec_rmsnorm_avx512(y2, x, w, len, 1e-6f);
                CHECK(memcmp(y1, y2, sizeof(float) * (size_t)len) == 0, "rmsnorm mode %d length %d: avx512 != generic",
                      mode, len);
                memcpy(y2, x, sizeof(float) * (size_t)len);
                vec_rmsnorm_avx512(y2, y2, w, len, 1e-6f);
                CHECK(memcmp(y1, y2, sizeof(float) * (size_t)len) == 0, "rmsnorm in place, length %d", len);
            }
        }
        free(x), free(w), free(y1), free(y2);
    }
    /* the scan maximum on 16 lanes == mathx_scan_max: ties, signed zeros (a zero maximum
     * keeps the first zero's sign), NaN (never taken) and infinities, lengths 1..100 */
    {
        float v[100];
        int bad = 0;
        for (int rep = 0; rep < 3000; rep++) {
            int n = 1 + rep % 100, c = rep % 5;
            for (int e = 0; e < n; e++) {
                float r = frand();
                v[e] = c == 0 ? r : c == 1 ? (float)(int)(r * 3.0f) : c == 2 ? (r < 0 ? -0.0f : 0.0f) - (r < -0.5f)
                     : c == 3 ? (r < -0.8f ? NAN : r < -0.6f ? -INFINITY : r) : (r < 0 ? -0.0f : 0.0f);
            }
            if (rep % 7 == 0) v[(rep / 7) % n] = NAN;
            float a1 = mathx_scan_max(v, n), a2 = vec_scan_max_avx512(v, n);
            if (memcmp(&a1, &a2, 4) && bad++ < 5) fprintf(stderr, "scan max n %d rep %d: %g vs %g\n", n, rep, a1, a2);
        }
        CHECK(bad == 0, "%d scan maxima differ from mathx_scan_max", bad);
        v[0] = -0.0f, v[1] = 0.0f, v[2] = -1.0f;
        float z = vec_scan_max_avx512(v, 3);
        CHECK(z == 0.0f && signbit(z), "a zero maximum keeps the first zero's sign");
        v[0] = NAN, v[1] = NAN;
        CHECK(vec_scan_max_avx512(v, 2) == -INFINITY, "all NaN: -inf, as the scan");
    }
    /* top-k routing: the one-pass form equals the definition, with many ties, signed
     * zeros and k up to n */
    {
        float v[130];
        int32_t a[130], b[130];
        for (int rep = 0; rep < 400; rep++) {
            int n = 1 + rep % 130, k = 1 + (rep * 7) % n;
            for (int e = 0; e < n; e++) {
                int c = rep % 3;
                v[e] = c == 0 ? frand() : c == 1 ? (float)(int)(frand() * 3.0f) : (frand() < 0 ? -0.0f : 0.0f);
            }
            mathx_topk_reference(v, n, k, a);
            mathx_topk(v, n, k, b);
            CHECK(memcmp(a, b, sizeof(int32_t) * (size_t)k) == 0, "topk n %d k %d (rep %d) differs from the definition", n, k, rep);
        }
        v[0] = NAN, v[1] = 2.0f, v[2] = NAN, v[3] = 5.0f;
        mathx_topk_reference(v, 4, 3, a);
        mathx_topk(v, 4, 3, b);
        CHECK(memcmp(a, b, sizeof(int32_t) * 3) == 0, "topk with NaN follows the definition");
    }
    /* exp16 agrees with mathx_exp through the attention path: also check the scalar exp at edges */
    CHECK(mathx_exp(0.0f) == 1.0f && mathx_exp(-100.0f) == 0.0f && isinf(mathx_exp(100.0f)), "exp edges");
    printf("attention: %d (head dim, mode, group, position) cases, avx512 group bitwise equal to generic per head\n", checked);
    return test_summary();
}
