/* test_quant.c — SIMD kernels (src/cpu/quant_avx2.c, quant_avx512.c) against the scalar
 * reference bit for bit; the reference itself against an independent (ggml-layout)
 * dequantizer and a double-precision dot product; fp16 conversions exhaustively.
 *
 *   test_quant          run the tests
 *   test_quant bench    GB/s of weight bytes per type x level (4096x4096, n_tok 1 and 8) */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "cpu/cpu_quant.h"
#include "quant.h"
#include "test.h"

/* ---- rng -------------------------------------------------------------------------- */


static const uint32_t ALL_TYPES[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q4_1, QT_Q5_0,
                                     QT_Q5_1, QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
#define N_TYPES (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* ---- weights ------------------------------------------------------------------------ */

/* A random finite fp16: sane (|v| in about [2^-12, 2^3]) or, adversarially, zero,
 * subnormal, tiny or the largest. */
static fp16_t rnd_fp16_scale(int adv) {
    uint16_t sign = (uint16_t)(test_rndi(2) << 15);
    if (adv) {
        switch (test_rndi(6)) {
        case 0: return sign; /* +-0 */
        case 1: return (uint16_t)(sign | (1 + test_rndi(0x3FF))); /* subnormal */
        case 2: return (uint16_t)(sign | 0x0400 | test_rndi(0x3FF)); /* smallest normals */
        case 3: return (uint16_t)(sign | 0x7BFF); /* 65504 */
        default: break;
        }
    }
    int e = 3 + test_rndi(18); /* biased exponent 3..20: 2^-12 .. 2^5 */
    return (uint16_t)(sign | (e << 10) | test_rndi(0x400));
}

/* Offsets of the fp16 scale fields of one block. */
static void scale_fields(uint32_t type, int *o, int *n) {
    *n = 0;
    switch (type) {
    case QT_Q4_0: case QT_Q5_0: case QT_Q8_0: o[(*n)++] = 0; break;
    case QT_Q4_1: case QT_Q5_1: case QT_Q4_K: case QT_Q5_K: o[(*n)++] = 0; o[(*n)++] = 2; break;
    case QT_Q6_K: o[(*n)++] = 208; break;
    default: break;
    }
}

static void fill_weights(uint32_t type, uint8_t *w, size_t nbytes, int adv) {
    const quant_traits *tr = quant_traits_of(type);
    if (type == QT_F32) {
        float *f = (float *)w;
        for (size_t i = 0; i < nbytes / 4; i++) {
            int c = adv ? test_rndi(8) : 7;
            f[i] = c == 0 ? 0.0f : c == 1 ? -0.0f : c == 2 ? bits_f32((uint32_t)test_rndi(1 << 23) | (test_rnd() & 0x80000000u))
                 : c == 3 ? test_rnds() * 1e15f : test_rnds() * 4.0f;
        }
        return;
    }
    if (type == QT_F16 || type == QT_BF16) {
        uint16_t *h = (uint16_t *)w;
        for (size_t i = 0; i < nbytes / 2; i++) {
            if (type == QT_F16) {
                uint16_t v;
                do v = (uint16_t)test_rnd(); while (((v >> 10) & 0x1F) == 0x1F); /* finite, incl. subnormals */
                h[i] = v;
            } else {
                h[i] = (uint16_t)(f32_bits(test_rnds() * (adv && test_rndi(4) == 0 ? 1e15f : 3.0f)) >> 16);
                if (adv && test_rndi(8) == 0) h[i] = (uint16_t)(test_rndi(2) << 15 | test_rndi(128)); /* +-0, subnormal */
            }
        }
        return;
    }
    for (size_t i = 0; i < nbytes; i++) w[i] = (uint8_t)test_rnd();
    const size_t nb = nbytes / tr->bytes;
    int off[2], nf;
    scale_fields(type, off, &nf);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * tr->bytes;
        if (adv && test_rndi(3) == 0) {
            /* max-magnitude quants: every quant bit set (Q4/Q5: q=15/31, Q6_K q=63 and
             * scales -128 or 127, Q4_K/Q5_K 6-bit scales 63), or Q8_0 all -128 / 127 */
            int v = test_rndi(2) ? 0xFF : (type == QT_Q8_0 ? 0x80 : 0x00);
            memset(blk, v, tr->bytes);
            if (type == QT_Q8_0 && test_rndi(2)) memset(blk, 0x7F, tr->bytes);
            if (type == QT_Q6_K && test_rndi(2)) memset(blk + 192, 0x80, 16);
        }
        for (int f = 0; f < nf; f++) {
            fp16_t s = rnd_fp16_scale(adv);
            memcpy(blk + off[f], &s, 2);
        }
    }
}

/* ---- activations --------------------------------------------------------------------- */

/* Float activations of one row: per 32 values one of several kinds. */
static void fill_act_f32(float *x, int k, int adv) {
    for (int i0 = 0; i0 < k; i0 += 32) {
        const int n = DT_MIN(32, k - i0);
        float *v = x + i0;
        int kind = adv ? test_rndi(9) : 0;
        float sc = powf(2.0f, (float)(test_rndi(16) - 8));
        for (int i = 0; i < n; i++) v[i] = test_rnds() * sc;
        switch (kind) {
        case 1: for (int i = 0; i < n; i++) v[i] = 0.0f; break; /* all-zero block */
        case 2: /* ties: amax 127*2^e so d = 2^e and x/d = j + 0.5 exactly */
        {
            float p = powf(2.0f, (float)(test_rndi(10) - 5));
            for (int i = 0; i < n; i++) v[i] = ((float)(test_rndi(254) - 127) + 0.5f) * p;
            v[test_rndi(n)] = (test_rndi(2) ? 127.0f : -127.0f) * p;
            break;
        }
        case 3: for (int i = 0; i < n; i++) v[i] = test_rnds() * 1e20f; break; /* large */
        case 4: for (int i = 0; i < n; i++) v[i] = test_rndi(3) ? 0.0f : test_rnds(); break; /* sparse */
        case 5: for (int i = 0; i < n; i++) v[i] = test_rndi(2) ? -0.0f : 0.0f; v[test_rndi(n)] = test_rnds(); break;
        case 6: for (int i = 0; i < n; i++) v[i] = test_rnds() * 1e-30f; break; /* small normal */
        case 7: for (int i = 0; i < n; i++) v[i] = (float)(test_rndi(255) - 127); break; /* integers */
        default: break;
        }
    }
}

/* Extra kinds only for activation quantization (the reference's behaviour there is
 * taken as it is): subnormals where d underflows, inf, NaN. */
static void fill_act_exotic(float *x, int k) {
    for (int i0 = 0; i0 < k; i0 += 32) {
        float *v = x + i0;
        switch (test_rndi(6)) {
        case 0: for (int i = 0; i < 32; i++) v[i] = bits_f32((uint32_t)test_rndi(200)) * (test_rndi(2) ? 1.0f : -1.0f); break;
        case 1: for (int i = 0; i < 32; i++) v[i] = bits_f32((uint32_t)test_rndi(1 << 23)) * (test_rndi(2) ? 1.0f : -1.0f); break;
        case 2: v[test_rndi(32)] = test_rndi(2) ? INFINITY : -INFINITY; break;
        case 3: v[test_rndi(32)] = NAN; break;
        case 4: for (int i = 0; i < 32; i++) v[i] = test_rnds() * 3e38f; break;
        default: break;
        }
    }
}

/* ---- independent dequantizers (transcribed from the ggml block layouts) ------------------ */

static void ref_dequant(uint32_t type, const uint8_t *src, float *y, int k) {
    const quant_traits *tr = quant_traits_of(type);
    const int nb = k / (int)tr->blck;
    for (int i = 0; i < nb; i++) {
        const uint8_t *x = src + (size_t)i * tr->bytes;
        float d, m;
        switch (type) {
        case QT_Q4_0:
            d = fp16_to_f32(*(const uint16_t *)x);
            for (int j = 0; j < 16; j++) {
                y[j] = (float)((x[2 + j] & 0x0F) - 8) * d;
                y[j + 16] = (float)((x[2 + j] >> 4) - 8) * d;
            }
            break;
        case QT_Q4_1:
            d = fp16_to_f32(*(const uint16_t *)x), m = fp16_to_f32(*(const uint16_t *)(x + 2));
            for (int j = 0; j < 16; j++) {
                y[j] = (float)(x[4 + j] & 0x0F) * d + m;
                y[j + 16] = (float)(x[4 + j] >> 4) * d + m;
            }
            break;
        case QT_Q5_0: case QT_Q5_1: {
            const int o = type == QT_Q5_0 ? 2 : 4;
            d = fp16_to_f32(*(const uint16_t *)x);
            m = type == QT_Q5_1 ? fp16_to_f32(*(const uint16_t *)(x + 2)) : 0.0f;
            uint32_t qh;
            memcpy(&qh, x + o, 4);
            for (int j = 0; j < 16; j++) {
                const uint8_t xh0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
                const uint8_t xh1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
                const int x0 = (x[o + 4 + j] & 0x0F) | xh0, x1 = (x[o + 4 + j] >> 4) | xh1;
                if (type == QT_Q5_0) {
                    y[j] = (float)(x0 - 16) * d;
                    y[j + 16] = (float)(x1 - 16) * d;
                } else {
                    y[j] = (float)x0 * d + m;
                    y[j + 16] = (float)x1 * d + m;
                }
            }
            break;
        }
        case QT_Q8_0:
            d = fp16_to_f32(*(const uint16_t *)x);
            for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)x[2 + j] * d;
            break;
        case QT_Q4_K: case QT_Q5_K: {
            d = fp16_to_f32(*(const uint16_t *)x);
            const float mn = fp16_to_f32(*(const uint16_t *)(x + 2));
            const uint8_t *scales = x + 4;
            const uint8_t *ql = x + (type == QT_Q4_K ? 16 : 48), *qh = x + 16;
            int is = 0;
            uint8_t u1 = 1, u2 = 2;
            float *yy = y;
            for (int j = 0; j < 256; j += 64) {
                uint8_t sc, mm;
                quant_k_scale_min(is + 0, scales, &sc, &mm);
                const float d1 = d * sc, m1 = mn * mm;
                quant_k_scale_min(is + 1, scales, &sc, &mm);
                const float d2 = d * sc, m2 = mn * mm;
                for (int l = 0; l < 32; ++l) {
                    int q = ql[l] & 0xF;
                    if (type == QT_Q5_K) q += (qh[l] & u1) ? 16 : 0;
                    *yy++ = d1 * (float)q - m1;
                }
                for (int l = 0; l < 32; ++l) {
                    int q = ql[l] >> 4;
                    if (type == QT_Q5_K) q += (qh[l] & u2) ? 16 : 0;
                    *yy++ = d2 * (float)q - m2;
                }
                ql += 32;
                is += 2;
                u1 = (uint8_t)(u1 << 2);
                u2 = (uint8_t)(u2 << 2);
            }
            break;
        }
        case QT_Q6_K: {
            d = fp16_to_f32(*(const uint16_t *)(x + 208));
            const uint8_t *ql = x, *qh = x + 128;
            const int8_t *sc = (const int8_t *)(x + 192);
            float *yy = y;
            for (int n = 0; n < 256; n += 128) {
                for (int l = 0; l < 32; ++l) {
                    const int is = l / 16;
                    const int q1 = (int)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int q2 = (int)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int q3 = (int)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    yy[l + 0] = d * sc[is + 0] * q1;
                    yy[l + 32] = d * sc[is + 2] * q2;
                    yy[l + 64] = d * sc[is + 4] * q3;
                    yy[l + 96] = d * sc[is + 6] * q4;
                }
                yy += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
            break;
        }
        default: break;
        }
        y += tr->blck;
    }
}

/* Dequantized activation (d*q) of one row, double. */
static void act_dequant(enum quant_act a, const uint8_t *src, double *x, int k) {
    if (a == QA_Q8_32) {
        const block_q8a *b = (const block_q8a *)src;
        for (int i = 0; i < k; i++) x[i] = (double)b[i / 32].d * b[i / 32].q[i % 32];
    } else {
        const block_q8k *b = (const block_q8k *)src;
        for (int i = 0; i < k; i++) x[i] = (double)b[i / 256].d * b[i / 256].q[i % 256];
    }
}

/* ---- the gemm comparison ------------------------------------------------------------- */

static enum cpu_level g_max; /* best level of this machine */

/* The SIMD kernels under test: kv = KV_FORMS * (level - CPU_AVX2) + v, v 0 the level's gemm
 * (cpu_quant_gemm), 1 / 2 / 3 its gemm in the plain / touch / two-l1 stream form where that is
 * another kernel than the ones before it (cpu_quant_gemm_form), else NULL. */
#define KV_FORMS 4
static quant_gemm_fn kernel_of(uint32_t type, int kv) {
    static const enum cpu_stream form[KV_FORMS] = {CPU_STREAM_NEAR_FAR, CPU_STREAM_PLAIN, CPU_STREAM_TOUCH,
                                                   CPU_STREAM_TWO_L1};
    const enum cpu_level lv = (enum cpu_level)(CPU_AVX2 + kv / KV_FORMS);
    quant_gemm_fn f[KV_FORMS];
    f[0] = cpu_quant_gemm(type, lv);
    for (int v = 1; v <= kv % KV_FORMS; v++) {
        f[v] = cpu_quant_gemm_form(type, lv, form[v]);
        for (int u = 0; u < v && f[v]; u++)
            if (f[u] == f[v]) f[v] = NULL;
    }
    return f[kv % KV_FORMS];
}
static const char *const KV_NAME[KV_FORMS] = {"", " plain", " touch", " two-l1"};

/* One case: rows [r0, r1) of R, n_tok tokens, length k; generic vs every SIMD kernel (kernel_of). */
static void gemm_case(uint32_t type, int R, int r0, int r1, int n_tok, int k, int wadv, int aadv) {
    const quant_traits *tr = quant_traits_of(type);
    const size_t rb = quant_row_bytes(type, k);
    const size_t ab = quant_act_bytes(tr->act, k);
    uint8_t *w = xmalloc(rb * (size_t)R + 64);
    fill_weights(type, w, rb * (size_t)R, wadv);
    float *xf = xmalloc((size_t)k * 4);
    uint8_t *a = xmalloc(ab * (size_t)n_tok + 64);
    for (int t = 0; t < n_tok; t++) {
        fill_act_f32(xf, k, aadv);
        quant_act_row(tr->act, xf, a + (size_t)t * ab, k);
    }
    const size_t stride = (size_t)R + 5;
    const size_t on = stride * (size_t)n_tok;
    float *ref = xmalloc(on * 4), *got = xmalloc(on * 4);
    for (size_t i = 0; i < on; i++) ref[i] = bits_f32(0x7FC0DEAD);
    tr->gemm(w, rb, r0, r1, k, a, ab, n_tok, ref, stride);
    for (int kv = 0; kv < KV_FORMS * ((int)g_max - CPU_AVX2 + 1); kv++) {
        const int lv = CPU_AVX2 + kv / KV_FORMS;
        quant_gemm_fn f = kernel_of(type, kv);
        if (!f) continue;
        for (size_t i = 0; i < on; i++) got[i] = bits_f32(0x7FC0DEAD);
        f(w, rb, r0, r1, k, a, ab, n_tok, got, stride);
        int bad = memcmp(ref, got, on * 4) != 0;
        if (bad) {
            for (size_t i = 0; i < on; i++)
                if (f32_bits(ref[i]) != f32_bits(got[i])) {
                    fprintf(stderr, "  first diff at tok %zu row %zu: ref %a (%08x) got %a (%08x)\n", i / stride,
                            i % stride, ref[i], f32_bits(ref[i]), got[i], f32_bits(got[i]));
                    break;
                }
        }
        CHECK(!bad, "%s %s%s R=%d rows [%d,%d) n_tok=%d k=%d wadv=%d aadv=%d: not bitwise equal", tr->name,
              cpu_level_name((enum cpu_level)lv), KV_NAME[kv % KV_FORMS], R, r0, r1, n_tok, k, wadv, aadv);
    }
    free(w), free(xf), free(a), free(ref), free(got);
}

static const int K_LEG[] = {32, 64, 96, 160, 256, 1024, 4096};
static const int K_KQ[] = {256, 512, 768, 1280, 4096};
static const int K_FL[] = {1, 7, 31, 32, 33, 100, 257, 1024, 4096};
static const int RS[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 67};

static void test_gemm_equal(void) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = ALL_TYPES[ti];
        const quant_traits *tr = quant_traits_of(type);
        const int *ks = tr->blck == 32 ? K_LEG : tr->blck == 256 ? K_KQ : K_FL;
        const int nk = tr->blck == 32 ? 7 : tr->blck == 256 ? 5 : 9;
        int ncase = 0;
        /* every n_tok 1..9 with assorted shapes */
        for (int nt = 1; nt <= 9; nt++)
            for (int rep = 0; rep < 16; rep++) {
                const int R = RS[test_rndi(14)];
                const int r0 = rep & 1 ? test_rndi(R) : 0;
                const int r1 = rep & 2 ? r0 + 1 + test_rndi(R - r0) : R;
                const int k = ks[test_rndi(nk)];
                gemm_case(type, R, r0, r1, nt, k, (rep >> 2) & 1, ((rep >> 3) + nt) & 1);
                ncase++;
            }
        /* every k x every row count */
        for (int i = 0; i < nk; i++)
            for (int j = 0; j < 14; j++, ncase++) gemm_case(type, RS[j], 0, RS[j], 1 + test_rndi(4), ks[i], (i + j) & 1, 1);
        for (int i = 0; i < nk; i++, ncase++) gemm_case(type, 67, 3, 64, 1 + test_rndi(3), ks[i], i & 1, 1);
        /* larger token counts, including more than one accumulator set (> 64) */
        gemm_case(type, 33, 1, 33, 16, ks[nk > 3 ? 3 : 0], 0, 1);
        gemm_case(type, 20, 0, 20, 64, ks[nk - 1], 1, 1);
        gemm_case(type, 17, 2, 17, 70, ks[0], 1, 1);
        gemm_case(type, 67, 0, 67, 33, ks[1], 0, 0);
        gemm_case(type, 48, 5, 41, 13 + test_rndi(20), ks[nk - 2], 1, 1);
        gemm_case(type, 16, 0, 16, 129, ks[1], 1, 1);
        ncase += 6;
        /* random everything */
        for (int rep = 0; rep < 150; rep++, ncase++) {
            const int R = 1 + test_rndi(67), r0 = test_rndi(R), r1 = r0 + 1 + test_rndi(R - r0);
            gemm_case(type, R, r0, r1, 1 + test_rndi(rep % 10 ? 12 : 40), ks[test_rndi(nk)], test_rndi(2), test_rndi(2));
        }
        (void)ncase;
    }
}

/* Float rows whose lane accumulators are -0 (products underflowing below zero) with a
 * tail of k % 32 elements: lanes past the tail must keep their -0. */
static void test_signed_zero_tails(void) {
    const uint32_t types[3] = {QT_F32, QT_F16, QT_BF16};
    for (int ti = 0; ti < 3; ti++) {
        const quant_traits *tr = quant_traits_of(types[ti]);
        for (int k = 1; k <= 70; k += 3) {
            const int R = 5, NT = 3;
            const size_t rb = quant_row_bytes(types[ti], k);
            uint8_t *w = xmalloc(rb * R);
            float *x = xmalloc((size_t)k * NT * 4), ref[R * NT], got[R * NT];
            for (int i = 0; i < k * R; i++) {
                if (types[ti] == QT_F32) ((float *)w)[i] = -1e-30f;
                else if (types[ti] == QT_F16) ((uint16_t *)w)[i] = 0x8001;
                else ((uint16_t *)w)[i] = (uint16_t)(f32_bits(-1e-30f) >> 16);
            }
            for (int i = 0; i < k * NT; i++) x[i] = types[ti] == QT_F16 ? 1e-40f : 1e-30f;
            tr->gemm(w, rb, 0, R, k, x, (size_t)k * 4, NT, ref, R);
            for (int kv = 0; kv < KV_FORMS * ((int)g_max - CPU_AVX2 + 1); kv++) {
                quant_gemm_fn f = kernel_of(types[ti], kv);
                if (!f) continue;
                for (int nt = 1; nt <= NT; nt += NT - 1) { /* one token (its own row count) and three */
                    memset(got, 0, sizeof got);
                    f(w, rb, 0, R, k, x, (size_t)k * 4, nt, got, R);
                    CHECK(!memcmp(ref, got, sizeof(float) * (size_t)R * (size_t)nt) && (k < 32 || f32_bits(ref[0]) == 0x80000000u),
                          "%s %s%s k=%d n_tok=%d: signed zero through the tail (ref %08x got %08x)", tr->name,
                          cpu_level_name((enum cpu_level)(CPU_AVX2 + kv / KV_FORMS)), KV_NAME[kv % KV_FORMS], k, nt,
                          f32_bits(ref[0]), f32_bits(got[0]));
                }
            }
            free(w), free(x);
        }
    }
}

/* Row strides whose 16-row span does not fit an int32 (the kernels' gathers then load
 * row by row): rows 2^31 + 4 KiB apart in a sparse mapping. */
static void test_huge_stride(void) {
    const size_t stride = ((size_t)1 << 31) + 4096;
    const int R = 3, NT = 2;
    const size_t span = stride * (R - 1) + 65536;
    uint8_t *w = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED) {
        printf("  huge-stride test skipped (no %zu-byte mapping)\n", span);
        return;
    }
    const uint32_t types[4] = {QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    for (int ti = 0; ti < 4; ti++) {
        const quant_traits *tr = quant_traits_of(types[ti]);
        const int k = 512;
        const size_t rb = quant_row_bytes(types[ti], k), ab = quant_act_bytes(tr->act, k);
        for (int r = 0; r < R; r++) fill_weights(types[ti], w + (size_t)r * stride, rb, 0);
        float xf[512];
        uint8_t *a = xmalloc(ab * NT);
        for (int t = 0; t < NT; t++) {
            fill_act_f32(xf, k, 0);
            quant_act_row(tr->act, xf, a + (size_t)t * ab, k);
        }
        float ref[R * NT], got[R * NT];
        tr->gemm(w, stride, 0, R, k, a, ab, NT, ref, R);
        for (int lv = CPU_AVX2; lv <= (int)g_max; lv++) {
            memset(got, 0, sizeof got);
            cpu_quant_gemm(types[ti], (enum cpu_level)lv)(w, stride, 0, R, k, a, ab, NT, got, R);
            CHECK(!memcmp(ref, got, sizeof ref), "%s %s: rows 2^31 bytes apart", tr->name, cpu_level_name((enum cpu_level)lv));
        }
        free(a);
    }
    munmap(w, span);
}

/* ---- the reference against doubles ----------------------------------------------------- */

static void test_reference(void) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = ALL_TYPES[ti];
        const quant_traits *tr = quant_traits_of(type);
        const int k = tr->blck == 256 ? 1024 : tr->blck == 32 ? 512 : 500;
        const int R = 12, NT = 3;
        const size_t rb = quant_row_bytes(type, k), ab = quant_act_bytes(tr->act, k);
        uint8_t *w = xmalloc(rb * R);
        uint8_t *a = xmalloc(ab * NT);
        float *xf = xmalloc((size_t)k * 4), *wd = xmalloc((size_t)k * 4), *wd2 = xmalloc((size_t)k * 4);
        double *xd = xmalloc((size_t)k * 8);
        float out[R * NT];
        double worst = 0.0;
        int deq_ok = 1;
        for (int rep = 0; rep < 4; rep++) {
            fill_weights(type, w, rb * R, rep & 1);
            for (int t = 0; t < NT; t++) {
                fill_act_f32(xf, k, rep >> 1);
                quant_act_row(tr->act, xf, a + (size_t)t * ab, k);
            }
            tr->gemm(w, rb, 0, R, k, a, ab, NT, out, R);
            for (int r = 0; r < R; r++) {
                tr->dequant_row(w + (size_t)r * rb, wd, k);
                if (tr->blck > 1) {
                    ref_dequant(type, w + (size_t)r * rb, wd2, k);
                    if (memcmp(wd, wd2, (size_t)k * 4)) deq_ok = 0;
                }
                for (int t = 0; t < NT; t++) {
                    if (tr->act == QA_F32) {
                        memcpy(xf, a + (size_t)t * ab, (size_t)k * 4);
                        for (int i = 0; i < k; i++) xd[i] = xf[i];
                    } else {
                        act_dequant(tr->act, a + (size_t)t * ab, xd, k);
                    }
                    double s = 0, sa = 0;
                    for (int i = 0; i < k; i++) {
                        s += (double)wd[i] * xd[i];
                        sa += fabs((double)wd[i] * xd[i]);
                    }
                    const double err = fabs((double)out[t * R + r] - s);
                    const double rel = sa > 0 ? err / sa : err;
                    if (rel > worst) worst = rel;
                }
            }
        }
        if (tr->blck > 1) CHECK(deq_ok, "%s: quant.c dequant_row differs from the ggml layout", tr->name);
        CHECK(worst < 1e-5, "%s: reference gemm vs double dot of dequantized operands: rel err %.3g", tr->name, worst);
        printf("  reference %-5s k=%d: max |err| / sum|terms| = %.2e\n", tr->name, k, worst);
        free(w), free(a), free(xf), free(wd), free(wd2), free(xd);
    }
}

/* ---- activation quantization ----------------------------------------------------------- */

static void test_act_quant(void) {
    const int ks[] = {256, 512, 1024, 4096};
    for (int lv = CPU_AVX2; lv <= (int)g_max; lv++) {
        for (int ai = 1; ai <= 2; ai++) {
            const enum quant_act act = (enum quant_act)ai;
            int bad = 0, n = 0;
            for (int rep = 0; rep < 200; rep++, n++) {
                const int k = ks[rep % 4];
                float *x = xmalloc((size_t)k * 4);
                fill_act_f32(x, k, rep % 3 != 0);
                if (rep % 5 == 4) fill_act_exotic(x, k);
                const size_t ab = quant_act_bytes(act, k);
                uint8_t *r = xmalloc(ab), *g = xmalloc(ab);
                memset(r, 0xA5, ab);
                memset(g, 0x5A, ab);
                quant_act_row(act, x, r, k);
                cpu_quant_act_row(act, x, g, k, (enum cpu_level)lv);
                if (memcmp(r, g, ab)) bad++;
                free(x), free(r), free(g);
            }
            CHECK(!bad, "act quant %s %s: %d of %d rows differ", ai == 1 ? "Q8_32" : "Q8_256",
                  cpu_level_name((enum cpu_level)lv), bad, n);
        }
        /* F32 activations pass through */
        float x[37], y[37];
        fill_act_f32(x, 37, 1);
        cpu_quant_act_row(QA_F32, x, y, 37, (enum cpu_level)lv);
        CHECK(!memcmp(x, y, sizeof x), "act F32 copy at %s", cpu_level_name((enum cpu_level)lv));
    }
    /* rint by magic number == round-half-even for |v| < 2^22, on ties and neighbours */
    int bad = 0;
    for (int i = -300; i <= 300; i++) {
        const float v = (float)i * 0.5f;
        if (quant_rint(v) != nearbyintf(v)) bad++;
        const float up = nextafterf(v, 1e9f), dn = nextafterf(v, -1e9f);
        if (quant_rint(up) != nearbyintf(up) || quant_rint(dn) != nearbyintf(dn)) bad++;
    }
    CHECK(!bad, "quant_rint differs from round-half-even on %d values", bad);
}

/* ---- fp16 ----------------------------------------------------------------------------------- */

__attribute__((target("avx512f"))) static int f16c_zmm_check(void) {
    int bad = 0;
    for (int h0 = 0; h0 < 65536; h0 += 16) {
        uint16_t hs[16];
        float f[16];
        for (int i = 0; i < 16; i++) hs[i] = (uint16_t)(h0 + i);
        _mm512_storeu_ps(f, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)hs)));
        for (int i = 0; i < 16; i++) {
            const float r = fp16_to_f32(hs[i]);
            if (isnan(r) ? !isnan(f[i]) : f32_bits(r) != f32_bits(f[i])) bad++;
        }
    }
    return bad;
}

static void test_fp16(void) {
    int round_bad = 0, f16c_bad = 0, nan_bad = 0, cvt_bad = 0;
    for (int h = 0; h < 65536; h++) {
        const float f = fp16_to_f32((fp16_t)h);
        const float c = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
        if (isnan(f)) {
            if (!isnan(c) || (f32_to_fp16(f) & 0x7C00) != 0x7C00 || !(f32_to_fp16(f) & 0x3FF)) nan_bad++;
            continue;
        }
        if (f32_to_fp16(f) != h) round_bad++;
        if (f32_bits(f) != f32_bits(c)) f16c_bad++;
    }
    CHECK(!round_bad, "f32_to_fp16(fp16_to_f32(h)) != h for %d values", round_bad);
    CHECK(!f16c_bad, "F16C cvtph differs from fp16_to_f32 for %d values", f16c_bad);
    CHECK(!nan_bad, "fp16 NaN handling wrong for %d values", nan_bad);
    if (g_max >= CPU_AVX512) CHECK(!f16c_zmm_check(), "zmm cvtph differs from fp16_to_f32");
    /* f32 -> fp16 rounding against F16C (nearest even): every fp16 value, its midpoints to
     * the neighbours and the floats next to them, plus random floats */
    for (int h = 0; h < 0x7C00; h++) {
        const float a = fp16_to_f32((fp16_t)h), b = h < 0x7BFF ? fp16_to_f32((fp16_t)(h + 1)) : 65520.0f;
        const float mid = (float)(((double)a + (double)b) * 0.5);
        const float cand[5] = {a, mid, nextafterf(mid, 0.0f), nextafterf(mid, 1e30f), -mid};
        for (int i = 0; i < 5; i++) {
            const int c = _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(cand[i]), _MM_FROUND_TO_NEAREST_INT), 0);
            if (f32_to_fp16(cand[i]) != (fp16_t)c) cvt_bad++;
        }
    }
    for (int i = 0; i < 1000000; i++) {
        float f = bits_f32((uint32_t)test_rnd());
        if (isnan(f)) continue;
        const int c = _mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
        if (f32_to_fp16(f) != (fp16_t)c) cvt_bad++;
    }
    CHECK(!cvt_bad, "f32_to_fp16 differs from F16C round-to-nearest-even for %d values", cvt_bad);
    /* bf16 */
    int bf_bad = 0;
    for (int h = 0; h < 65536; h++)
        if (f32_bits(bf16_to_f32((bf16_t)h)) != (uint32_t)h << 16) bf_bad++;
    CHECK(!bf_bad, "bf16_to_f32 wrong for %d values", bf_bad);
}

/* ---- dispatch API --------------------------------------------------------------------------- */

static void test_dispatch(void) {
    CHECK(!strcmp(cpu_level_name(CPU_GENERIC), "generic") && !strcmp(cpu_level_name(CPU_AVX2), "avx2") &&
              !strcmp(cpu_level_name(CPU_AVX512), "avx512"),
          "cpu_level_name");
    for (size_t i = 0; i < N_TYPES; i++) {
        const quant_traits *tr = quant_traits_of(ALL_TYPES[i]);
        CHECK(cpu_quant_gemm(ALL_TYPES[i], CPU_GENERIC) == tr->gemm, "%s generic dispatch", tr->name);
        for (int lv = CPU_AVX2; lv <= CPU_AVX512; lv++)
            CHECK(cpu_quant_gemm(ALL_TYPES[i], (enum cpu_level)lv) != NULL, "%s has a gemm at every level", tr->name);
        if (g_max >= CPU_AVX2)
            CHECK(cpu_quant_gemm(ALL_TYPES[i], CPU_AVX2) != tr->gemm, "%s has an AVX2 kernel", tr->name);
        if (g_max >= CPU_AVX512)
            CHECK(cpu_quant_gemm(ALL_TYPES[i], CPU_AVX512) != cpu_quant_gemm(ALL_TYPES[i], CPU_AVX2),
                  "%s has an AVX-512 kernel", tr->name);
        /* every form but near-far has its own one-token float kernel at AVX-512, and only there */
        const bool fl = quant_type_is_float(ALL_TYPES[i]);
        for (int lv = CPU_GENERIC; lv <= (int)g_max; lv++)
            for (int f = 0; f < CPU_STREAM_COUNT; f++) {
                const bool own = fl && lv == CPU_AVX512 && f != CPU_STREAM_NEAR_FAR;
                CHECK((cpu_quant_gemm_form(ALL_TYPES[i], (enum cpu_level)lv, (enum cpu_stream)f) !=
                       cpu_quant_gemm(ALL_TYPES[i], (enum cpu_level)lv)) == own,
                      "%s %s form %d: %s kernel", tr->name, cpu_level_name((enum cpu_level)lv), f, own ? "its own" : "the level's");
            }
    }
    CHECK(cpu_quant_gemm(9 /* Q8_1 */, CPU_AVX512) == NULL && cpu_quant_gemm(39, CPU_AVX2) == NULL &&
              cpu_quant_gemm(1000, CPU_AVX2) == NULL,
          "no gemm for unsupported / unknown types");
    const char *old = getenv("DITTO_CPU");
    char *saved = old ? strdup(old) : NULL;
    setenv("DITTO_CPU", "generic", 1);
    CHECK(cpu_level_detect() == CPU_GENERIC, "DITTO_CPU=generic lowers the level");
    setenv("DITTO_CPU", "avx2", 1);
    CHECK(cpu_level_detect() == (g_max < CPU_AVX2 ? g_max : CPU_AVX2), "DITTO_CPU=avx2");
    setenv("DITTO_CPU", "avx512", 1);
    CHECK(cpu_level_detect() == g_max, "DITTO_CPU=avx512 never raises the level");
    if (saved) setenv("DITTO_CPU", saved, 1), free(saved);
    else unsetenv("DITTO_CPU");
}

/* ---- bench ------------------------------------------------------------------------------------ */

static int bench(void) {
    const int R = 4096, K = 4096;
    printf("GB/s of weight bytes, %dx%d, one thread (n_tok=1 | n_tok=8)\n", R, K);
    printf("%-6s", "type");
    for (int lv = 0; lv <= (int)g_max; lv++) printf(" | %8s t=1 %8s t=8", cpu_level_name((enum cpu_level)lv), "");
    printf("\n");
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = ALL_TYPES[ti];
        const quant_traits *tr = quant_traits_of(type);
        const size_t rb = quant_row_bytes(type, K), ab = quant_act_bytes(tr->act, K);
        uint8_t *w = xaligned(rb * R);
        fill_weights(type, w, rb * R, 0);
        uint8_t *a = xaligned(ab * 8);
        float *xf = xmalloc((size_t)K * 4), *out = xmalloc((size_t)R * 8 * 4);
        for (int t = 0; t < 8; t++) {
            fill_act_f32(xf, K, 0);
            quant_act_row(tr->act, xf, a + (size_t)t * ab, K);
        }
        printf("%-6s", tr->name);
        for (int lv = 0; lv <= (int)g_max; lv++) {
            quant_gemm_fn f = cpu_quant_gemm(type, (enum cpu_level)lv);
            for (int nt = 1; nt <= 8; nt += 7) {
                f(w, rb, 0, R, K, a, ab, nt, out, R); /* warm */
                int reps = 0;
                double t0 = time_now(), t1;
                do {
                    f(w, rb, 0, R, K, a, ab, nt, out, R);
                    reps++;
                    t1 = time_now();
                } while (t1 - t0 < 0.25);
                printf(" | %13.2f", (double)rb * R * reps / (t1 - t0) / 1e9);
            }
        }
        printf("\n");
        fflush(stdout);
        free(w), free(a), free(xf), free(out);
    }
    return 0;
}

int main(int argc, char **argv) {
    test_rng_seed(0x9E3779B97F4A7C15ULL);
    g_max = cpu_level_hw();
    if (argc > 1 && !strcmp(argv[1], "bench")) return bench();
    printf("cpu: %s; SIMD levels tested:", cpu_level_name(g_max));
    for (int lv = CPU_AVX2; lv <= (int)g_max; lv++) printf(" %s", cpu_level_name((enum cpu_level)lv));
    if (g_max == CPU_GENERIC) printf(" none");
    printf(" (skipped:");
    for (int lv = (int)g_max + 1; lv <= CPU_AVX512; lv++) printf(" %s", cpu_level_name((enum cpu_level)lv));
    printf(")\n");
    double t0 = time_now();
    test_dispatch();
    test_fp16();
    printf("  fp16 checks %.2fs\n", time_now() - t0);
    t0 = time_now();
    test_act_quant();
    printf("  act quant checks %.2fs\n", time_now() - t0);
    t0 = time_now();
    test_reference();
    printf("  reference checks %.2fs\n", time_now() - t0);
    t0 = time_now();
    test_gemm_equal();
    test_signed_zero_tails();
    test_huge_stride();
    printf("  gemm equality checks %.2fs\n", time_now() - t0);
    return test_summary();
}
