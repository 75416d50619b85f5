/* test_repack.c — repacked (row-interleaved) Q4_K / Q5_K / Q6_K / Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 matrices (src/cpu/repack.c,
 * repack_avx*.c): the repack round-trips, split repacks equal whole ones, and the repacked
 * gemm at every level (generic, avx2 — its plain and, where the CPU has AVX-VNNI, its AVX-VNNI
 * build — and avx512, where the CPU has them) is bitwise equal to the
 * reference gemm (quant_traits_of(type)->gemm) on the original row-major matrix, with nothing
 * written outside rows [r0, r1) x tokens. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/cpu_quant.h"
#include "cpu/prefetch.h"
#include "cpu/repack.h"
#include "quant.h"
#include "test.h"

/* ---- rng ------------------------------------------------------------------------------ */


/* ---- weights ---------------------------------------------------------------------------- */

/* A finite fp16 scale: sane, or adversarially zero, subnormal, smallest normal, 65504. */
/* Balanced data (test_gemm's last round): d and dmin of like size and activations of one scale,
 * so that every sub-block's scale and min term shows in the fp32 result; with the wide random
 * ranges a term is often below the rounding and a wrong one goes unseen. */
static int g_balanced;

static fp16_t rnd_fp16_scale(int adv) {
    const uint16_t sign = (uint16_t)(test_rndi(2) << 15);
    if (g_balanced) return (uint16_t)(sign | ((14 + test_rndi(3)) << 10) | test_rndi(0x400));
    if (adv) {
        switch (test_rndi(6)) {
        case 0: return sign;
        case 1: return (uint16_t)(sign | (1 + test_rndi(0x3FF)));
        case 2: return (uint16_t)(sign | 0x0400 | test_rndi(0x3FF));
        case 3: return (uint16_t)(sign | 0x7BFF);
        default: break;
        }
    }
    const int e = 3 + test_rndi(18);
    return (uint16_t)(sign | (e << 10) | test_rndi(0x400));
}

/* Random well-formed blocks; adv adds max-quant blocks (every quant bit set, 6-bit scales 63 /
 * int8 scales -128 or 127), zero-scale blocks and extreme fp16 d. */
static bool is_q32(uint32_t type) { return rp_is_q32(type); }

static void fill_weights(uint32_t type, uint8_t *w, size_t nbytes, int adv) {
    const quant_traits *tr = quant_traits_of(type);
    for (size_t i = 0; i < nbytes; i++) w[i] = (uint8_t)test_rnd();
    const size_t nb = nbytes / tr->bytes;
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * tr->bytes;
        if (is_q32(type)) { /* adversarially every quant (and 5th bit) at one end of its range; Q8_0: 127 / -128 */
            const int kind = adv ? test_rndi(4) : 3;
            if (kind < 2) memset(blk + 2, kind ? 0xFF : (type == QT_Q8_0 ? 0x80 : 0x00), tr->bytes - 2);
            if (kind == 2 && type == QT_Q8_0) memset(blk + 2, 0x7F, tr->bytes - 2);
            const fp16_t d = rnd_fp16_scale(adv), m = rnd_fp16_scale(adv);
            memcpy(blk, &d, 2);
            if (type == QT_Q4_1 || type == QT_Q5_1) memcpy(blk + 2, &m, 2); /* m right after d in both */
            continue;
        }
        if (adv) {
            switch (test_rndi(5)) {
            case 0: memset(blk, 0xFF, tr->bytes); break; /* max quants, max scales */
            case 1: /* zero sub-block scales (and mins) */
                if (type == QT_Q6_K) memset(((block_q6_K *)(void *)blk)->scales, 0, 16);
                else memset(((block_q4_K *)(void *)blk)->scales, 0, K_SCALE_SIZE); /* Q5_K: the same offset */
                break;
            case 2:
                if (type == QT_Q6_K) { /* max |q - 32| with the most negative scales */
                    memset(blk, 0, tr->bytes);
                    memset(((block_q6_K *)(void *)blk)->scales, test_rndi(2) ? 0x80 : 0x7F, 16);
                } else if (type == QT_Q5_K) { /* max scales and mins; quants all 0 or all 31 */
                    memset(blk, 0xFF, tr->bytes);
                    const int v = test_rndi(2) ? 0x00 : 0xFF;
                    memset(((block_q5_K *)(void *)blk)->qs, v, QK_K / 2);
                    memset(((block_q5_K *)(void *)blk)->qh, v, QK_K / 8);
                } else {
                    memset(blk, 0xFF, tr->bytes);
                    memset(((block_q4_K *)(void *)blk)->qs, test_rndi(2) ? 0x00 : 0xFF, QK_K / 2);
                }
                break;
            default: break;
            }
        }
        fp16_t d = rnd_fp16_scale(adv), dm = rnd_fp16_scale(adv);
        if (type == QT_Q4_K || type == QT_Q5_K) { /* d, dmin at the same offsets in both */
            memcpy(&((block_q4_K *)(void *)blk)->d, &d, 2);
            memcpy(&((block_q4_K *)(void *)blk)->dmin, &dm, 2);
        } else {
            memcpy(&((block_q6_K *)(void *)blk)->d, &d, 2);
        }
    }
}

/* ---- activations ------------------------------------------------------------------------- */

static void fill_act_f32(float *x, int k, int adv) {
    for (int i0 = 0; i0 < k; i0 += 32) {
        float *v = x + i0;
        const float sc = g_balanced ? 1.0f : powf(2.0f, (float)(test_rndi(16) - 8));
        for (int i = 0; i < 32; i++) v[i] = test_rnds() * sc;
        switch (adv ? test_rndi(8) : 0) {
        case 1: for (int i = 0; i < 32; i++) v[i] = 0.0f; break;
        case 2: for (int i = 0; i < 32; i++) v[i] = test_rnds() * 1e20f; break;
        case 3: for (int i = 0; i < 32; i++) v[i] = test_rndi(3) ? 0.0f : test_rnds(); break;
        case 4: for (int i = 0; i < 32; i++) v[i] = test_rnds() * 1e-30f; break;
        case 5: for (int i = 0; i < 32; i++) v[i] = (float)(test_rndi(255) - 127); break;
        default: break;
        }
    }
}

/* One activation row of k values in format qa; adversarially some blocks are made directly:
 * all-zero, or every |q| = 127 (one sign or random signs), with a random d. */
static void make_act(enum quant_act qa, uint8_t *dst, int k, int adv, float *xf) {
    fill_act_f32(xf, k, adv);
    quant_act_row(qa, xf, dst, k);
    if (!adv) return;
    if (qa == QA_Q8_32) {
        block_q8a *b = (block_q8a *)(void *)dst;
        for (int i = 0; i < k / QK32; i++) {
            const int kind = test_rndi(6);
            if (kind >= 3) continue;
            b[i].s = 0;
            for (int l = 0; l < QK32; l++) {
                b[i].q[l] = (int8_t)(kind == 0 ? 0 : kind == 1 ? (test_rndi(2) ? 127 : -127) : (i & 1 ? -127 : 127));
                b[i].s += b[i].q[l];
            }
            b[i].d = kind == 0 ? 0.0f : bits_f32(f32_bits(1.0f) + (uint32_t)test_rndi(1 << 23)) * powf(2.0f, (float)(test_rndi(40) - 20));
        }
        return;
    }
    block_q8k *b = (block_q8k *)(void *)dst;
    for (int i = 0; i < k / QK_K; i++) {
        const int kind = test_rndi(6);
        if (kind >= 3) continue;
        for (int l = 0; l < QK_K; l++)
            b[i].q[l] = (int8_t)(kind == 0 ? 0 : kind == 1 ? (test_rndi(2) ? 127 : -127) : (i & 1 ? -127 : 127));
        b[i].d = kind == 0 ? 0.0f : bits_f32(f32_bits(1.0f) + (uint32_t)test_rndi(1 << 23)) * powf(2.0f, (float)(test_rndi(40) - 20));
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].q[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}

/* ---- the comparison ------------------------------------------------------------------------ */

static enum cpu_level g_max;
static int n_cases;

/* The (level, stream form) pairs whose kernels differ, up to this CPU's level: generic; AVX2
 * near-far and plain; AVX-512 every form. Returns their count (at most 7). */
static int level_forms(int *lv, int *fm) {
    int n = 0;
    lv[n] = CPU_GENERIC, fm[n++] = CPU_STREAM_NEAR_FAR;
    if (g_max >= CPU_AVX2) {
        lv[n] = CPU_AVX2, fm[n++] = CPU_STREAM_NEAR_FAR;
        lv[n] = CPU_AVX2, fm[n++] = CPU_STREAM_PLAIN;
    }
    if (g_max >= CPU_AVX512)
        for (int f = 0; f < CPU_STREAM_COUNT; f++) lv[n] = CPU_AVX512, fm[n++] = f;
    return n;
}

static void gemm_case(uint32_t type, int R, int r0, int r1, int n_tok, int k, int wadv, int aadv) {
    const quant_traits *tr = quant_traits_of(type);
    const size_t rb = quant_row_bytes(type, k), ab = quant_act_bytes(tr->act, k);
    const size_t gb = repack_group_bytes(type, k);
    uint8_t *w = xmalloc(rb * (size_t)R);
    fill_weights(type, w, rb * (size_t)R, wadv);
    const int ng = (R + 15) / 16;
    uint8_t *wp = xaligned(repack_bytes(type, R, k));
    /* repack in two pieces, as parallel loaders would */
    const int gs = test_rndi(ng + 1);
    repack_rows(type, w, rb, R, k, wp, gs, ng);
    repack_rows(type, w, rb, R, k, wp, 0, gs);
    float *xf = xmalloc((size_t)k * 4);
    uint8_t *a = xmalloc(ab * (size_t)n_tok);
    for (int t = 0; t < n_tok; t++) make_act(tr->act, a + (size_t)t * ab, k, aadv, xf);
    const size_t stride = (size_t)ng * 16 + 3;
    const size_t on = stride * (size_t)n_tok;
    float *ref = xmalloc(on * 4), *got = xmalloc(on * 4);
    for (size_t i = 0; i < on; i++) ref[i] = bits_f32(0x7FC0DEAD);
    tr->gemm(w, rb, r0, r1, k, a, ab, n_tok, ref, stride);
    /* every level and its stream forms (cpu/prefetch.h) */
    int lvs[8], fms[8];
    const int nlf = level_forms(lvs, fms);
    for (int lf = 0; lf < nlf; lf++) {
        const int lv = lvs[lf], fm = fms[lf];
        const quant_gemm_fn f = repack_gemm(type, (enum cpu_level)lv, (enum cpu_stream)fm);
        for (size_t i = 0; i < on; i++) got[i] = bits_f32(0x7FC0DEAD);
        f(wp, gb, r0, r1, k, a, ab, n_tok, got, stride);
        const int bad = memcmp(ref, got, on * 4) != 0;
        if (bad)
            for (size_t i = 0; i < on; i++)
                if (f32_bits(ref[i]) != f32_bits(got[i])) {
                    fprintf(stderr, "  first diff at tok %zu row %zu: ref %a (%08x) got %a (%08x)\n", i / stride,
                            i % stride, ref[i], f32_bits(ref[i]), got[i], f32_bits(got[i]));
                    break;
                }
        CHECK(!bad, "%s %s %s R=%d rows [%d,%d) n_tok=%d k=%d wadv=%d aadv=%d: not bitwise equal to the reference",
              tr->name, cpu_level_name((enum cpu_level)lv), cpu_stream_name((enum cpu_stream)fm), R, r0, r1, n_tok, k,
              wadv, aadv);
        /* told what follows the call (or nothing), the kernel computes the same bits: its
         * prefetch runs on into those regions and reads nothing from them */
        const cpu_next nx = {2, {w, wp}, {rb * (size_t)R, repack_bytes(type, R, k)}};
        for (int h = 0; h < 2; h++) {
            for (size_t i = 0; i < on; i++) got[i] = bits_f32(0x7FC0DEAD);
            repack_gemm_next(type, (enum cpu_level)lv, (enum cpu_stream)fm)(wp, gb, r0, r1, k, a, ab, n_tok, got, stride,
                                                                            h ? &nx : NULL);
            CHECK(!memcmp(ref, got, on * 4), "%s %s %s R=%d rows [%d,%d) n_tok=%d k=%d, next %s: not bitwise equal",
                  tr->name, cpu_level_name((enum cpu_level)lv), cpu_stream_name((enum cpu_stream)fm), R, r0, r1, n_tok,
                  k, h ? "given" : "NULL");
        }
    }
    /* on a CPU with AVX-VNNI the AVX2 level runs that build (above); the plain AVX2 build too */
    if (g_max >= CPU_AVX2 && cpu_avx_vnni()) {
        const cpu_next nx = {2, {w, wp}, {rb * (size_t)R, repack_bytes(type, R, k)}};
        for (int h = 0; h < 6; h++) {
            const enum cpu_stream fm = h < 3 ? CPU_STREAM_NEAR_FAR : CPU_STREAM_PLAIN;
            for (size_t i = 0; i < on; i++) got[i] = bits_f32(0x7FC0DEAD);
            if (h % 3 == 0) repack_gemm_avx2(type, fm)(wp, gb, r0, r1, k, a, ab, n_tok, got, stride);
            else repack_gemm_next_avx2(type, fm)(wp, gb, r0, r1, k, a, ab, n_tok, got, stride, h % 3 == 2 ? &nx : NULL);
            CHECK(!memcmp(ref, got, on * 4), "%s avx2 (non-VNNI build, %s, %s) R=%d rows [%d,%d) n_tok=%d k=%d: not bitwise equal",
                  tr->name, cpu_stream_name(fm), h % 3 ? "next" : "gemm", R, r0, r1, n_tok, k);
        }
    }
    n_cases++;
    free(w), free(wp), free(xf), free(a), free(ref), free(got);
}

/* r0: a multiple of 16 below R; r1: a multiple of 16 above r0 or R (sometimes any row). */
static void rnd_range(int R, int *r0, int *r1) {
    const int ng = (R + 15) / 16;
    *r0 = 16 * test_rndi(ng);
    const int c = test_rndi(4);
    if (c == 0) *r1 = R;
    else if (c == 3) *r1 = *r0 + 1 + test_rndi(R - *r0);
    else {
        const int e = *r0 + 16 * (1 + test_rndi(ng - *r0 / 16));
        *r1 = DT_MIN(R, e);
    }
}

/* Row lengths: K-quants, and the 32-block types (odd block counts among them). */
static const int KS_K[] = {256, 512, 768, 1280, 2048, 4096};
static const int KS_32[] = {32, 96, 480, 768, 2080, 4096};
#define NK 6

static void test_gemm(uint32_t type) {
    const int before = test_failed, c0 = n_cases;
    const int *const KS = is_q32(type) ? KS_32 : KS_K;
    /* every row count 1..70 (twice), random range, k and token count */
    for (int R = 1; R <= 70; R++)
        for (int rep = 0; rep < 2; rep++) {
            int r0, r1;
            rnd_range(R, &r0, &r1);
            gemm_case(type, R, r0, r1, 1 + test_rndi(R % 3 ? 4 : 12), KS[test_rndi(NK)], (R + rep) & 1, ((R >> 1) + rep) & 1);
        }
    /* every token count 1..20, and 33, 64, 65, 70 (more than one accumulator set) */
    static const int NT_EXTRA[] = {33, 64, 65, 70};
    for (int nt = 1; nt <= 24; nt++) {
        const int n = nt <= 20 ? nt : NT_EXTRA[nt - 21];
        for (int rep = 0; rep < 4; rep++) {
            const int R = 1 + test_rndi(70);
            int r0, r1;
            rnd_range(R, &r0, &r1);
            gemm_case(type, R, r0, r1, n, KS[test_rndi(n > 20 ? 3 : NK)], rep & 1, (rep >> 1) & 1);
        }
    }
    /* every k: full and sub ranges, both adversarial settings */
    for (int i = 0; i < NK; i++) {
        gemm_case(type, 48, 0, 48, 1 + test_rndi(9), KS[i], i & 1, 1);
        gemm_case(type, 67, 16, 64, 1 + test_rndi(9), KS[i], 1, i & 1);
        gemm_case(type, 67, 48, 67, 9 + test_rndi(9), KS[i], 0, 0);
        gemm_case(type, 16, 0, 16, 8, KS[i], 1, 1);
    }
    /* one token over 1..14 groups (the two-stream form's halves: even and odd counts, a partial
     * last group, a range starting past group 0) */
    for (int g = 1; g <= 14; g++) {
        const int R = 16 * g - (g % 3 == 0 ? 7 : 0);
        gemm_case(type, R, 0, R, 1, KS[test_rndi(NK)], g & 1, (g >> 1) & 1);
        if (g > 1) gemm_case(type, R, 16, R, 1, KS[test_rndi(NK)], (g >> 1) & 1, g & 1);
    }
    /* rows long enough that the kernels take fewer than 64 tokens per pass (nb = 64, 96) */
    gemm_case(type, 20, 0, 20, 40, 16384, 1, 1);
    gemm_case(type, 33, 16, 33, 70, 24576, 0, 1);
    /* rows too long for the Q4_K kernels' stack of pair sums (nb = 2049: made per block instead;
     * 16392 blocks of 32) */
    gemm_case(type, 20, 0, 20, 3, 2049 * QK_K, 1, 0);
    /* one token at the edge of the Q4_K one-token kernels' stack of min-term operands (RP_Q4K_HL_MAX
     * blocks: made once per call; one more: from the bsums in each block), adversarial activations
     * (pair sums +-4064) */
    gemm_case(type, 20, 0, 20, 1, RP_Q4K_HL_MAX * QK_K, 1, 1);
    gemm_case(type, 33, 0, 33, 1, (RP_Q4K_HL_MAX + 1) * QK_K, 0, 1);
    /* balanced data, every token count 1..9 */
    g_balanced = 1;
    for (int nt = 1; nt <= 9; nt++)
        for (int rep = 0; rep < 4; rep++) {
            const int R = 1 + test_rndi(70);
            int r0, r1;
            rnd_range(R, &r0, &r1);
            gemm_case(type, R, r0, r1, nt, KS[test_rndi(NK)], 0, 0);
        }
    g_balanced = 0;
    /* random everything */
    for (int rep = 0; rep < 100; rep++) {
        const int R = 1 + test_rndi(70);
        int r0, r1;
        rnd_range(R, &r0, &r1);
        gemm_case(type, R, r0, r1, 1 + test_rndi(rep % 5 ? 12 : 40), KS[test_rndi(NK)], test_rndi(2), test_rndi(2));
    }
    CHECK(test_failed == before, "%s: all %d repacked gemm cases bitwise equal", quant_traits_of(type)->name,
          n_cases - c0);
}

/* Round trip: repack_get_block returns every original block; padding rows are zero;
 * a misaligned repacked matrix gives the same results. */
static void test_layout(uint32_t type) {
    const quant_traits *tr = quant_traits_of(type);
    const int R = 37, k = is_q32(type) ? 736 : 768, nb = k / (int)tr->blck; /* odd nb: 23 and 3 */
    const size_t rb = quant_row_bytes(type, k), gb = repack_group_bytes(type, k);
    CHECK(gb % 64 == 0, "%s group bytes %zu multiple of 64", tr->name, gb);
    CHECK(repack_bytes(type, R, k) == 3 * gb, "%s repack_bytes", tr->name);
    if (type == QT_Q4_K || type == QT_Q5_K)
        CHECK(gb == 16 * rb, "%s repacked group = 16 rows exactly (%zu vs %zu)", tr->name, gb, 16 * rb);
    else if (type == QT_Q6_K) CHECK(gb == 16 * rb + 32, "Q6_K repacked group (odd nb) = 16 rows + 32 B (%zu vs %zu)", gb, 16 * rb);
    else CHECK(gb == 16 * (rb + tr->bytes), "%s repacked group (odd nb) = 16 rows + a block each (%zu vs %zu)", tr->name, gb, 16 * rb);
    CHECK(repack_group_bytes(QT_Q6_K, 2048) == 16 * quant_row_bytes(QT_Q6_K, 2048), "Q6_K even nb: no overhead");
    static const uint32_t T32[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0};
    for (int i = 0; i < 5; i++)
        CHECK(repack_group_bytes(T32[i], 2048) == 16 * quant_row_bytes(T32[i], 2048) &&
                  repack_group_bytes(T32[i], 64) == 16 * quant_row_bytes(T32[i], 64),
              "%s even nb: no overhead", quant_traits_of(T32[i])->name);
    uint8_t *w = xmalloc(rb * R);
    fill_weights(type, w, rb * R, 1);
    const size_t tot = repack_bytes(type, R, k);
    uint8_t *wp = xaligned(tot + 64);
    memset(wp, 0xA5, tot);
    repack_rows(type, w, rb, R, k, wp, 0, 3);
    int bad = 0, padbad = 0;
    for (int r = 0; r < 48; r++)
        for (int b = 0; b < nb; b++) {
            uint8_t blk[256];
            repack_get_block(type, wp, gb, k, r, b, blk);
            if (r < R) {
                if (memcmp(blk, w + (size_t)r * rb + (size_t)b * tr->bytes, tr->bytes)) bad++;
            } else {
                for (uint32_t i = 0; i < tr->bytes; i++) padbad += blk[i] != 0;
            }
        }
    CHECK(!bad, "%s: %d blocks do not round-trip", tr->name, bad);
    /* the repacked bytes are a function of the source alone (no stale destination bytes) */
    uint8_t *wz = xaligned(tot);
    repack_rows(type, w, rb, R, k, wz, 1, 3);
    repack_rows(type, w, rb, R, k, wz, 0, 1);
    CHECK(!memcmp(wz, wp, tot), "%s: repacked bytes depend on the destination's old contents", tr->name);
    free(wz);
    CHECK(!padbad, "%s: padding rows not zero (%d bytes)", tr->name, padbad);
    /* unaligned copy of the repacked matrix */
    uint8_t *wu = xmalloc(tot + 8);
    memcpy(wu + 4, wp, tot);
    const size_t ab = quant_act_bytes(tr->act, k);
    float xf[768];
    uint8_t *a = xmalloc(ab * 3);
    for (int t = 0; t < 3; t++) make_act(tr->act, a + t * ab, k, 1, xf);
    float ref[3 * 40], got[3 * 40];
    tr->gemm(w, rb, 0, R, k, a, ab, 3, ref, 40);
    /* every level and stream form, and the plain AVX2 build where the AVX-VNNI one runs; one token
     * (the one-token kernels) and three */
    quant_gemm_fn fns[10];
    int lvs[8], fms[8], nf = 0;
    const int nlf = level_forms(lvs, fms);
    for (int i = 0; i < nlf; i++) fns[nf++] = repack_gemm(type, (enum cpu_level)lvs[i], (enum cpu_stream)fms[i]);
    if (g_max >= CPU_AVX2 && cpu_avx_vnni())
        for (int f = 0; f < 2; f++) fns[nf++] = repack_gemm_avx2(type, f ? CPU_STREAM_PLAIN : CPU_STREAM_NEAR_FAR);
    for (int i = 0; i < nf; i++)
        for (int nt = 1; nt <= 3; nt += 2) {
            memset(got, 0, sizeof got);
            fns[i](wu + 4, gb, 0, R, k, a, ab, nt, got, 40);
            int diff = 0;
            for (int t = 0; t < nt; t++) diff |= memcmp(ref + 40 * t, got + 40 * t, (size_t)R * 4);
            CHECK(!diff, "%s kernel %d, %d tokens: unaligned repacked matrix", tr->name, i, nt);
        }
    free(w), free(wp), free(wu), free(a);
}

static void test_api(void) {
    CHECK(repack_supported(QT_Q4_K) && repack_supported(QT_Q5_K) && repack_supported(QT_Q6_K) &&
              repack_supported(QT_Q4_0) && repack_supported(QT_Q8_0),
          "Q4_K, Q5_K, Q6_K, Q4_0, Q8_0 supported");
    CHECK(repack_supported(QT_Q4_1) && repack_supported(QT_Q5_0) && repack_supported(QT_Q5_1),
          "Q4_1, Q5_0, Q5_1 supported");
    CHECK(!repack_supported(QT_F32) && !repack_supported(QT_F16) && !repack_supported(QT_BF16), "float types not");
    const enum cpu_stream NF = CPU_STREAM_NEAR_FAR, L1 = CPU_STREAM_TWO_L1;
    CHECK(repack_gemm(QT_F16, CPU_AVX512, NF) == NULL, "no gemm for an unsupported type");
    static const uint32_t TYPES[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0};
    for (int lv = CPU_GENERIC; lv <= CPU_AVX512; lv++)
        for (int i = 0; i < 8; i++)
            CHECK(repack_gemm(TYPES[i], (enum cpu_level)lv, NF) && repack_gemm_next(TYPES[i], (enum cpu_level)lv, NF),
                  "a %s kernel at level %s", quant_traits_of(TYPES[i])->name, cpu_level_name((enum cpu_level)lv));
    /* each level at or below the hardware's runs its own kernels, not a lower level's */
    for (int i = 0; i < 8; i++)
        for (int lv = CPU_AVX2; lv <= (int)g_max; lv++)
            CHECK(repack_gemm(TYPES[i], (enum cpu_level)lv, NF) != repack_gemm(TYPES[i], (enum cpu_level)(lv - 1), NF),
                  "%s: level %s has its own kernel", quant_traits_of(TYPES[i])->name, cpu_level_name((enum cpu_level)lv));
    CHECK(repack_bytes(QT_Q4_K, 0, 256) == 0 && repack_bytes(QT_Q4_K, 17, 256) == 2 * 16 * 144, "repack_bytes");
    /* the best level really dispatches to its own kernels */
    if (g_max >= CPU_AVX512)
        for (int i = 0; i < CPU_STREAM_COUNT; i++) {
            const enum cpu_stream fm = (enum cpu_stream)i;
            CHECK(repack_gemm(QT_Q4_K, CPU_AVX512, fm) == repack_gemm_avx512(QT_Q4_K, fm) &&
                      repack_gemm_avx512(QT_Q6_K, fm) &&
                      repack_gemm(QT_Q6_K, CPU_AVX512, fm) == repack_gemm_avx512(QT_Q6_K, fm),
                  "avx512 dispatch, stream form %s", cpu_stream_name(fm));
        }
    if (g_max >= CPU_AVX512)
        for (int i = 0; i < 8; i++)
            for (int a = 0; a < CPU_STREAM_COUNT; a++)
                for (int b = a + 1; b < CPU_STREAM_COUNT; b++)
                    CHECK(repack_gemm(TYPES[i], CPU_AVX512, (enum cpu_stream)a) !=
                                  repack_gemm(TYPES[i], CPU_AVX512, (enum cpu_stream)b) &&
                              repack_gemm_next(TYPES[i], CPU_AVX512, (enum cpu_stream)a) !=
                                  repack_gemm_next(TYPES[i], CPU_AVX512, (enum cpu_stream)b),
                          "%s: stream forms %s and %s have their own AVX-512 kernels", quant_traits_of(TYPES[i])->name,
                          cpu_stream_name((enum cpu_stream)a), cpu_stream_name((enum cpu_stream)b));
    const enum cpu_stream PL = CPU_STREAM_PLAIN;
    CHECK(repack_gemm(QT_Q4_K, CPU_GENERIC, NF) == repack_gemm(QT_Q4_K, CPU_GENERIC, PL), "generic: the form is ignored");
    if (g_max >= CPU_AVX2) { /* the AVX-VNNI build where the CPU has it (and DITTO_AVXVNNI is not 0) */
        quant_gemm_fn (*const a2)(uint32_t, enum cpu_stream) = cpu_avx_vnni() ? repack_gemm_avx2vnni : repack_gemm_avx2;
        CHECK(repack_gemm(QT_Q4_K, CPU_AVX2, NF) == a2(QT_Q4_K, NF) && a2(QT_Q6_K, NF) &&
                  repack_gemm(QT_Q6_K, CPU_AVX2, NF) == a2(QT_Q6_K, NF) && repack_gemm(QT_Q6_K, CPU_AVX2, PL) == a2(QT_Q6_K, PL) &&
                  repack_gemm_next(QT_Q4_K, CPU_AVX2, NF) ==
                      (cpu_avx_vnni() ? repack_gemm_next_avx2vnni : repack_gemm_next_avx2)(QT_Q4_K, NF),
              "avx2 dispatch (avx-vnni: %d)", cpu_avx_vnni());
        if (cpu_avx_vnni())
            CHECK(repack_gemm_avx2vnni(QT_Q4_K, NF) != repack_gemm_avx2(QT_Q4_K, NF), "the AVX-VNNI build is its own kernel");
        /* AVX2 has two forms: plain, and the requests (two-l1 runs near-far's) */
        for (int i = 0; i < 8; i++)
            CHECK(repack_gemm(TYPES[i], CPU_AVX2, NF) == repack_gemm(TYPES[i], CPU_AVX2, L1) &&
                      repack_gemm(TYPES[i], CPU_AVX2, NF) != repack_gemm(TYPES[i], CPU_AVX2, PL) &&
                      repack_gemm_next(TYPES[i], CPU_AVX2, NF) != repack_gemm_next(TYPES[i], CPU_AVX2, PL),
                  "%s: AVX2 plain has its own kernels, two-l1 is near-far's", quant_traits_of(TYPES[i])->name);
    }
    CHECK(repack_gemm(QT_Q4_K, CPU_GENERIC, NF) != repack_gemm_avx2(QT_Q4_K, NF), "generic is its own kernel");
    /* the form: DITTO_CPU_STREAM names one; anything else leaves the host's default */
    const char *old = getenv("DITTO_CPU_STREAM");
    char *keep = old ? strdup(old) : NULL;
    unsetenv("DITTO_CPU_STREAM");
    const enum cpu_stream def = cpu_stream_detect();
    setenv("DITTO_CPU_STREAM", "two-l1", 1);
    CHECK(cpu_stream_detect() == L1, "DITTO_CPU_STREAM=two-l1");
    setenv("DITTO_CPU_STREAM", "near-far", 1);
    CHECK(cpu_stream_detect() == NF, "DITTO_CPU_STREAM=near-far");
    setenv("DITTO_CPU_STREAM", "plain", 1);
    CHECK(cpu_stream_detect() == CPU_STREAM_PLAIN, "DITTO_CPU_STREAM=plain");
    setenv("DITTO_CPU_STREAM", "touch", 1);
    CHECK(cpu_stream_detect() == CPU_STREAM_TOUCH, "DITTO_CPU_STREAM=touch");
    setenv("DITTO_CPU_STREAM", "fast", 1);
    CHECK(cpu_stream_detect() == def, "DITTO_CPU_STREAM=fast is ignored");
    CHECK(!strcmp(cpu_stream_name(NF), "near-far") && !strcmp(cpu_stream_name(L1), "two-l1") &&
              !strcmp(cpu_stream_name(CPU_STREAM_PLAIN), "plain") && !strcmp(cpu_stream_name(CPU_STREAM_TOUCH), "touch"),
          "form names");
    for (int f = 0; f < CPU_STREAM_COUNT; f++)
        CHECK(cpu_stream_parse(cpu_stream_name((enum cpu_stream)f)) == f, "form %d's name parses back", f);
    CHECK(cpu_stream_select(CPU_GENERIC, -1) == NF && cpu_stream_select(CPU_GENERIC, PL) == NF, "generic: near-far");
    if (g_max >= CPU_AVX2) {
        CHECK(cpu_stream_select(CPU_AVX2, L1) == NF && cpu_stream_select(CPU_AVX2, NF) == NF &&
                  cpu_stream_select(CPU_AVX2, PL) == PL && cpu_stream_select(CPU_AVX2, CPU_STREAM_TOUCH) == PL,
              "AVX2: plain where plain or touch is asked for, else near-far");
        unsetenv("DITTO_CPU_STREAM");
        CHECK(cpu_stream_select(CPU_AVX2, -1) == NF, "AVX2 by default: near-far, whatever AVX-512's form");
        setenv("DITTO_CPU_STREAM", "plain", 1);
        CHECK(cpu_stream_select(CPU_AVX2, -1) == PL, "AVX2: DITTO_CPU_STREAM=plain");
        setenv("DITTO_CPU_STREAM", "touch", 1);
        CHECK(cpu_stream_select(CPU_AVX2, -1) == PL, "AVX2: DITTO_CPU_STREAM=touch runs plain");
        unsetenv("DITTO_CPU_STREAM");
    }
    if (g_max >= CPU_AVX512)
        CHECK(cpu_stream_select(CPU_AVX512, L1) == L1 && cpu_stream_select(CPU_AVX512, NF) == NF &&
                  cpu_stream_select(CPU_AVX512, -1) == cpu_stream_detect(),
              "at AVX-512 the form asked for, or the host's");
    if (keep) setenv("DITTO_CPU_STREAM", keep, 1);
    else unsetenv("DITTO_CPU_STREAM");
    free(keep);
}

int main(void) {
    test_rng_seed(0x2545F4914F6CDD1DULL);
    g_max = cpu_level_hw();
    printf("repack: levels generic..%s%s\n", cpu_level_name(g_max),
           g_max >= CPU_AVX2 && cpu_avx_vnni() ? " (avx2 in its AVX-VNNI build, and the plain one)" : "");
    const double t0 = time_now();
    test_api();
    test_layout(QT_Q4_K);
    test_layout(QT_Q5_K);
    test_layout(QT_Q6_K);
    test_layout(QT_Q4_0);
    test_layout(QT_Q4_1);
    test_layout(QT_Q5_0);
    test_layout(QT_Q5_1);
    test_layout(QT_Q8_0);
    test_gemm(QT_Q4_K);
    test_gemm(QT_Q5_K);
    test_gemm(QT_Q6_K);
    test_gemm(QT_Q4_0);
    test_gemm(QT_Q4_1);
    test_gemm(QT_Q5_0);
    test_gemm(QT_Q5_1);
    test_gemm(QT_Q8_0);
    int lvs[8], fms[8];
    printf("  %d gemm cases x %d kernels (levels and their stream forms) in %.1f s\n", n_cases, level_forms(lvs, fms),
           time_now() - t0);
    return test_summary();
}
