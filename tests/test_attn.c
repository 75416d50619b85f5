/* test_attn.c — every attention flavour (AVX2, AVX-512, as the CPU has them) is bitwise equal
 * to attn_head_generic, over one and many chunks, head dims 64/72/128, ordinary and extreme
 * scores; and the elementwise flavours (SwiGLU, RMSNorm, scan maximum) to their scalar forms. */
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

/* One SIMD level's flavours, checked against the scalar forms. */
typedef struct {
    enum cpu_level level;
    const char *name;
    int hd_mult; /* head dims the attention flavour takes */
    attn_fn attn;
    vec_swiglu_fn swiglu;
    vec_rmsnorm_fn rmsnorm;
    float (*scan_max)(const float *s, int n);
} flavour;

static const flavour flavours[] = {
    {CPU_AVX2, "avx2", 8, attn_group_avx2, vec_swiglu_avx2, vec_rmsnorm_avx2, vec_scan_max_avx2},
    {CPU_AVX512, "avx512", 16, attn_group_avx512, vec_swiglu_avx512, vec_rmsnorm_avx512, vec_scan_max_avx512},
};

static void check_flavour(const flavour *f) {
    /* groups of 1..9, 12 and 16 query heads (9 and up: more than one scores pass) sharing a KV head */
    const int ctx = 320, hds[] = {64, 72, 128}, groups[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16};
    const int NG = 16;
    int checked = 0;
    for (int hi = 0; hi < 3; hi++) {
        int hd = hds[hi];
        if (hd % f->hd_mult) continue;
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
                    f->attn(q, ng, K, V, pos, hd, scale, b, s2);
                    CHECK(memcmp(a, b, sizeof(float) * (size_t)ng * hd) == 0,
                          "hd %d mode %d group %d pos %d: %s != generic", hd, mode, ng, pos, f->name);
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
            f->swiglu(g, u, h2, len);
            CHECK(memcmp(h1, h2, sizeof(float) * (size_t)len) == 0, "swiglu length %d: %s != generic", len, f->name);
        }
        free(g), free(u), free(h1), free(h2);
    }
    /* RMSNorm: the flavour == mathx_rmsnorm over lengths 1..300 (partial lanes, one and many
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
                f->rmsnorm(y2, x, w, len, 1e-6f);
                CHECK(memcmp(y1, y2, sizeof(float) * (size_t)len) == 0, "rmsnorm mode %d length %d: %s != generic",
                      mode, len, f->name);
                memcpy(y2, x, sizeof(float) * (size_t)len);
                f->rmsnorm(y2, y2, w, len, 1e-6f);
                CHECK(memcmp(y1, y2, sizeof(float) * (size_t)len) == 0, "%s rmsnorm in place, length %d", f->name, len);
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
            float a1 = mathx_scan_max(v, n), a2 = f->scan_max(v, n);
            if (memcmp(&a1, &a2, 4) && bad++ < 5) fprintf(stderr, "scan max n %d rep %d: %g vs %g\n", n, rep, a1, a2);
        }
        CHECK(bad == 0, "%s: %d scan maxima differ from mathx_scan_max", f->name, bad);
        v[0] = -0.0f, v[1] = 0.0f, v[2] = -1.0f;
        float z = f->scan_max(v, 3);
        CHECK(z == 0.0f && signbit(z), "%s: a zero maximum keeps the first zero's sign", f->name);
        v[0] = NAN, v[1] = NAN;
        CHECK(f->scan_max(v, 2) == -INFINITY, "%s: all NaN: -inf, as the scan", f->name);
    }
    printf("attention: %d (head dim, mode, group, position) cases, %s group bitwise equal to generic per head\n", checked,
           f->name);
}

int main(void) {
    const enum cpu_level hw = cpu_level_hw();
    int levels = 0;
    for (size_t i = 0; i < sizeof flavours / sizeof *flavours; i++)
        if (flavours[i].level <= hw) check_flavour(&flavours[i]), levels++;
    if (!levels) printf("no AVX2 on this CPU: only the generic flavours exist\n");
    /* each level selects its own flavours (or the next lower level's for a head dim it lacks) */
    for (int lv = CPU_GENERIC; lv <= CPU_AVX512; lv++) {
        const flavour *f = lv == CPU_GENERIC ? NULL : &flavours[lv - CPU_AVX2];
        CHECK(attn_select(lv, 128) == (f ? f->attn : attn_group_generic), "level %d: attention flavour", lv);
        CHECK(vec_swiglu_select(lv) == (f ? f->swiglu : vec_swiglu_generic), "level %d: swiglu flavour", lv);
        CHECK(vec_rmsnorm_select(lv) == (f ? f->rmsnorm : vec_rmsnorm_generic), "level %d: rmsnorm flavour", lv);
    }
    CHECK(attn_select(CPU_AVX512, 72) == attn_group_avx2 && attn_select(CPU_AVX2, 36) == attn_group_generic,
          "head dims a flavour lacks fall back");
    /* RoPE (one baseline form for every level): vec_rope == the scalar formula (products, then
     * one subtraction or addition) for every half-width 1..80 (partial lanes and none), ordinary
     * and extreme values */
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
    return test_summary();
}
