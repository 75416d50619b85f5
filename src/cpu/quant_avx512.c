/* quant_avx512.c — AVX-512 (F/BW/VL/DQ + VNNI) gemm and activation-quantization
 * kernels, bitwise equal to the scalar reference in quant.c.
 *
 * Design (docs/arithmetic.md): 16 output rows at a time, SIMD lane = row. For each
 * weight block (ascending) every row's exact int32 block sum is formed with
 * vpdpbusd / vpmaddubsw+vpdpwssd (never a saturating form: every int16 intermediate
 * is bounded below 2^15 by the operand ranges noted at each use), 16 rows' partial
 * vectors are transposed-and-added into one vector of 16 row sums, and then each lane
 * runs the reference's fp32 chain: acc = fma(dw*da, (float)I, acc) (and the min term).
 * A weight block of a 16-row group is unpacked once per chunk of up to 8 tokens and
 * its loads from memory happen once for all tokens. The 16 rows' fp16 scales (and the
 * K-quants' 6-bit scales/mins, decoded for 16 rows at once) come in by dword gathers;
 * each row stream is prefetched PF_* bytes ahead. */
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu_quant.h"
#include "cpu/exp_avx512.h"
#include "cpu/prefetch.h"

#define AI static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define RG 16   /* rows per group = fp32 lanes */
#define TCH 8   /* tokens per chunk sharing one unpacked weight block */
#define TSUP 64 /* tokens whose accumulators live on the stack at once */

#define GEMM_ARGS                                                                          \
    const void *w, size_t row_bytes, int r0, int r1, int k, const void *act,               \
        size_t act_bytes, int n_tok, float *out, size_t out_stride
#define GEMM_PASS w, row_bytes, r0, r1, k, act, act_bytes, n_tok, out, out_stride

static inline uint32_t ld32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
#define LDU512(p) _mm512_loadu_si512((const void *)(p))
#define LDU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LDU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* ---- transposed reductions ---------------------------------------------------------- */

/* p[0..3] -> per 128-bit lane L: [sum p0.L, sum p1.L, sum p2.L, sum p3.L]. */
AI __m512i hsum4_128(__m512i p0, __m512i p1, __m512i p2, __m512i p3) {
    __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(p0, p1), _mm512_unpackhi_epi32(p0, p1));
    __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(p2, p3), _mm512_unpackhi_epi32(p2, p3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}
/* 16 vectors (row i in p[i]) -> lane i = sum of all 16 lanes of p[i]. */
AI __m512i reduce16(const __m512i *p) {
    __m512i u0 = hsum4_128(p[0], p[1], p[2], p[3]), u1 = hsum4_128(p[4], p[5], p[6], p[7]);
    __m512i u2 = hsum4_128(p[8], p[9], p[10], p[11]), u3 = hsum4_128(p[12], p[13], p[14], p[15]);
    __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xDD));
    __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u2, u3, 0x88), _mm512_shuffle_i32x4(u2, u3, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(w0, w1, 0x88), _mm512_shuffle_i32x4(w0, w1, 0xDD));
}
/* As reduce16 for vectors whose low 256 bits belong to block b and high 256 to b+1. */
AI void reduce16x2(const __m512i *p, __m512i *ib0, __m512i *ib1) {
    __m512i u0 = hsum4_128(p[0], p[1], p[2], p[3]), u1 = hsum4_128(p[4], p[5], p[6], p[7]);
    __m512i u2 = hsum4_128(p[8], p[9], p[10], p[11]), u3 = hsum4_128(p[12], p[13], p[14], p[15]);
    __m512i w0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u0, u1, 0x88), _mm512_shuffle_i32x4(u0, u1, 0xDD));
    __m512i w1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u2, u3, 0x88), _mm512_shuffle_i32x4(u2, u3, 0xDD));
    *ib0 = _mm512_shuffle_i32x4(w0, w1, 0x88);
    *ib1 = _mm512_shuffle_i32x4(w0, w1, 0xDD);
}

/* acc = fma(dw*da, (float)I, acc), per lane — the reference's two roundings. */
AI __m512 chain(__m512 acc, __m512 dw, float da, __m512i I) {
    return _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(I), acc);
}
/* acc = fma(-(dm*da), (float)M, acc). */
AI __m512 chain_neg(__m512 acc, __m512 dm, float da, __m512i M) {
    __m512 p = _mm512_mul_ps(dm, _mm512_set1_ps(da));
    p = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u)));
    return _mm512_fmadd_ps(p, _mm512_cvtepi32_ps(M), acc);
}

static inline __mmask16 row_mask(int nr) { return (__mmask16)((1u << nr) - 1u); }

#define PF_LEG 512 /* prefetch distance per row, bytes */
#define PF_KQ 512

/* Byte offsets of the 16 row pointers from rp[0] as int32, or -1 in lane 0 when they do
 * not fit (then gather_rows loads them one by one). */
static inline __m512i row_index(const uint8_t *const *rp) {
    int32_t idx[RG];
    for (int i = 0; i < RG; i++) {
        const ptrdiff_t d = rp[i] - rp[0];
        if (d < 0 || d > 0x7fffffff) return _mm512_set1_epi32(-1);
        idx[i] = (int32_t)d;
    }
    return _mm512_loadu_si512(idx);
}
/* The dword at rp[i] + off of each row. */
AI __m512i gather_rows(const uint8_t *const *rp, __m512i vidx, size_t off) {
    if (__builtin_expect(_mm_cvtsi128_si32(_mm512_castsi512_si128(vidx)) == 0, 1))
        return _mm512_i32gather_epi32(vidx, (const void *)(rp[0] + off), 1);
    uint32_t v[RG];
    for (int i = 0; i < RG; i++) v[i] = ld32(rp[i] + off);
    return _mm512_loadu_si512(v);
}

/* ---- legacy 32-blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ------------------------------------
 * Two consecutive blocks per zmm: bytes 0..31 block b, 32..63 block b+1, each in
 * element order, multiplied with the token's q bytes by vpdpbusd (u8 weights x s8
 * activations into int32, exact). Signed weights are offset to unsigned and corrected
 * with the block's activation sum s: Q4_0 q-8, Q5_0 q-16, Q8_0 (q^0x80)-128. */

AI size_t leg_bytes(int type) {
    return type == QT_Q4_0 ? 18 : type == QT_Q4_1 ? 20 : type == QT_Q5_0 ? 22 : type == QT_Q5_1 ? 24 : 34;
}
AI int leg_off(int type) {
    return type == QT_Q4_0 ? 8 : type == QT_Q5_0 ? 16 : type == QT_Q8_0 ? 128 : 0;
}

AI __m512i leg_unpack(const int type, const uint8_t *x0, const uint8_t *x1) {
    if (type == QT_Q8_0) {
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(LDU256(x0 + 2)), LDU256(x1 + 2), 1);
        return _mm512_xor_si512(z, _mm512_set1_epi8((char)0x80));
    }
    const int qs = type == QT_Q4_0 ? 2 : type == QT_Q4_1 ? 4 : type == QT_Q5_0 ? 6 : 8;
    const __m512i shv = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                         0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    __m256i y0 = _mm256_broadcastsi128_si256(LDU128(x0 + qs));
    __m256i y1 = _mm256_broadcastsi128_si256(LDU128(x1 + qs));
    __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(y0), y1, 1);
    z = _mm512_and_si512(_mm512_srlv_epi16(z, shv), _mm512_set1_epi8(0x0F));
    if (type == QT_Q5_0 || type == QT_Q5_1) {
        const int qh = type == QT_Q5_0 ? 2 : 4;
        __mmask64 m = (__mmask64)ld32(x0 + qh) | ((__mmask64)ld32(x1 + qh) << 32);
        z = _mm512_mask_add_epi8(z, m, z, _mm512_set1_epi8(0x10));
    }
    return z;
}

AI void gemm_legacy(const int type, GEMM_ARGS) {
    const int nb = k / QK32;
    const size_t bb = leg_bytes(type);
    const int has_m = type == QT_Q4_1 || type == QT_Q5_1;
    const int off = leg_off(type);
    __m512i psum[TCH][RG];
    __m512 acc[TSUP];
    for (int ts = 0; ts < n_tok; ts += TSUP) {
        const int nt = DT_MIN(TSUP, n_tok - ts);
        for (int g = r0; g < r1; g += RG) {
            const int nr = DT_MIN(RG, r1 - g);
            const uint8_t *rp[RG];
            cpu_quant_group_rows(w, row_bytes, g, nr, RG, rp);
            const __m512i vidx = row_index(rp);
            for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
            for (int b = 0; b < nb; b += 2) {
                const int two = b + 1 < nb;
                const int b1 = two ? b + 1 : b;
                for (int i = 0; i < RG; i++) {
                    const uint8_t *pf = rp[i] + (size_t)b * bb + PF_LEG;
                    _mm_prefetch((const char *)pf, _MM_HINT_T0);
                    if (bb > 32) _mm_prefetch((const char *)pf + 64, _MM_HINT_T0);
                }
                /* d (and m) of the 16 rows: dword gathers, fp16 in the low (high) half */
                const __m512i g0 = gather_rows(rp, vidx, (size_t)b * bb);
                const __m512i g1 = gather_rows(rp, vidx, (size_t)b1 * bb);
                const __m512 vd0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g0));
                const __m512 vd1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g1));
                __m512 vm0 = _mm512_setzero_ps(), vm1 = _mm512_setzero_ps();
                if (has_m) {
                    vm0 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g0, 16)));
                    vm1 = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g1, 16)));
                }
                for (int tc = 0; tc < nt; tc += TCH) {
                    const int ntc = DT_MIN(TCH, nt - tc);
                    const block_q8a *ya[TCH];
                    __m512i A[TCH];
                    for (int t = 0; t < ntc; t++) {
                        ya[t] = (const block_q8a *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes);
                        A[t] = _mm512_inserti64x4(_mm512_castsi256_si512(LDU256(ya[t][b].q)), LDU256(ya[t][b1].q), 1);
                    }
                    for (int i = 0; i < RG; i++) {
                        const __m512i W = leg_unpack(type, rp[i] + (size_t)b * bb, rp[i] + (size_t)b1 * bb);
                        for (int t = 0; t < ntc; t++)
                            psum[t][i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W, A[t]);
                    }
                    for (int t = 0; t < ntc; t++) {
                        __m512i I0, I1;
                        reduce16x2(psum[t], &I0, &I1);
                        const block_q8a *y0 = &ya[t][b], *y1 = &ya[t][b1];
                        if (off) {
                            I0 = _mm512_sub_epi32(I0, _mm512_set1_epi32(off * y0->s));
                            I1 = _mm512_sub_epi32(I1, _mm512_set1_epi32(off * y1->s));
                        }
                        __m512 a = acc[tc + t];
                        a = chain(a, vd0, y0->d, I0);
                        if (has_m)
                            a = _mm512_fmadd_ps(_mm512_mul_ps(vm0, _mm512_set1_ps(y0->d)),
                                                _mm512_set1_ps((float)y0->s), a);
                        if (two) {
                            a = chain(a, vd1, y1->d, I1);
                            if (has_m)
                                a = _mm512_fmadd_ps(_mm512_mul_ps(vm1, _mm512_set1_ps(y1->d)),
                                                    _mm512_set1_ps((float)y1->s), a);
                        }
                        acc[tc + t] = a;
                    }
                }
            }
            for (int t = 0; t < nt; t++)
                _mm512_mask_storeu_ps(out + (size_t)(ts + t) * out_stride + g, row_mask(nr), acc[t]);
        }
    }
}

/* ---- K-quants: Q4_K, Q5_K, Q6_K --------------------------------------------------------
 * Per row and 64-element slice c: weights u8 (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63),
 * vpmaddubsw with the s8 activations (|pair| <= 2*63*127 = 16002 < 2^15: no saturation),
 * then vpdpwssd with the int16 sub-block scales into int32. Q6_K's -32 offset is
 * -32*sum_j sc_j*bsum_j, added as one vpdpwssd of (sc<<5) with -bsums. */

AI size_t kq_bytes(int type) { return type == QT_Q4_K ? 144 : type == QT_Q5_K ? 176 : 210; }

/* psum[t][i] = partial int32 vector of row i (block at rp[i]+boff) x token t.
 * scb: the 8 6-bit scales of each row (Q4_K/Q5_K); Q6_K reads its int8 scales itself. */
AI void kq_rows(const int type, const int NT, const uint8_t *const *rp, size_t boff,
                const uint8_t *scb, const block_q8k *const *y, const __m512i *negb,
                __m512i (*psum)[RG]) {
    const __m512i m0f = _mm512_set1_epi8(0x0F);
    const __m512i c04 = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL,
                                         0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0, 0);
    for (int i = 0; i < RG; i++) {
        const uint8_t *blk = rp[i] + boff;
        __m512i P[8];
        UNROLL for (int t = 0; t < NT; t++) P[t] = _mm512_setzero_si512();
        if (type == QT_Q6_K) {
            const __m256i s16 = _mm256_cvtepi8_epi16(LDU128(blk + 192));
            const __m512i s512 = _mm512_castsi256_si512(s16);
            const __m512i c42 = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL,
                                                 0x0002000200020002LL, 0x0002000200020002LL,
                                                 0x0004000400040004LL, 0x0004000400040004LL,
                                                 0x0004000400040004LL, 0x0004000400040004LL);
            const __m512i c02 = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL,
                                                 0x0002000200020002LL, 0x0002000200020002LL, 0, 0, 0, 0);
            const __m512i m30 = _mm512_set1_epi8(0x30);
            /* int16 lane p of 64-element slice c carries sub-block 4c + p/8 */
            const __m512i i0 = _mm512_set_epi64(0x0003000300030003LL, 0x0003000300030003LL,
                                                0x0002000200020002LL, 0x0002000200020002LL,
                                                0x0001000100010001LL, 0x0001000100010001LL, 0, 0);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m512i L = LDU512(blk + 64 * h);
                const __m512i H = _mm512_broadcast_i64x4(LDU256(blk + 128 + 32 * h));
                const __m512i Wlo = _mm512_or_si512(_mm512_and_si512(L, m0f),
                                                    _mm512_and_si512(_mm512_sllv_epi16(H, c42), m30));
                const __m512i Whi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m0f),
                                                    _mm512_and_si512(_mm512_srlv_epi16(H, c02), m30));
                const __m512i Slo = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16((short)(8 * h))), s512);
                const __m512i Shi = _mm512_permutexvar_epi16(_mm512_add_epi16(i0, _mm512_set1_epi16((short)(8 * h + 4))), s512);
                UNROLL for (int t = 0; t < NT; t++) {
                    P[t] = _mm512_dpwssd_epi32(P[t], _mm512_maddubs_epi16(Wlo, LDU512(y[t]->q + 128 * h)), Slo);
                    P[t] = _mm512_dpwssd_epi32(P[t], _mm512_maddubs_epi16(Whi, LDU512(y[t]->q + 128 * h + 64)), Shi);
                }
            }
            /* |sc<<5| <= 4096, |bsum| <= 2032 */
            const __m512i s32 = _mm512_zextsi256_si512(_mm256_slli_epi16(s16, 5));
            UNROLL for (int t = 0; t < NT; t++) P[t] = _mm512_dpwssd_epi32(P[t], s32, negb[t]);
        } else {
            const int qs = type == QT_Q4_K ? 16 : 48;
            const __m512i s8 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)(scb + 8 * i))));
            __m512i Hb = _mm512_setzero_si512();
            if (type == QT_Q5_K) Hb = _mm512_broadcast_i64x4(LDU256(blk + 16));
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                const __m512i G = _mm512_broadcast_i64x4(LDU256(blk + qs + 32 * c));
                __m512i W = _mm512_and_si512(_mm512_srlv_epi16(G, c04), m0f);
                if (type == QT_Q5_K) {
                    const __m512i bits = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                            _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
                    W = _mm512_mask_add_epi8(W, _mm512_test_epi8_mask(Hb, bits), W, _mm512_set1_epi8(0x10));
                }
                /* int16 lanes 0..15: sub-block 2c, 16..31: 2c+1 */
                const __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                                                       _mm256_set1_epi16((short)(2 * c + 1)), 1);
                const __m512i S = _mm512_permutexvar_epi16(idx, s8);
                UNROLL for (int t = 0; t < NT; t++)
                    P[t] = _mm512_dpwssd_epi32(P[t], _mm512_maddubs_epi16(W, LDU512(y[t]->q + 64 * c)), S);
            }
        }
        UNROLL for (int t = 0; t < NT; t++) psum[t][i] = P[t];
    }
}

AI void gemm_kq(const int type, GEMM_ARGS) {
    const int nb = k / QK_K;
    const size_t bb = kq_bytes(type);
    const int is6 = type == QT_Q6_K;
    __m512i psum[TCH][RG];
    __m512 acc[TSUP];
    for (int ts = 0; ts < n_tok; ts += TSUP) {
        const int nt = DT_MIN(TSUP, n_tok - ts);
        for (int g = r0; g < r1; g += RG) {
            const int nr = DT_MIN(RG, r1 - g);
            const uint8_t *rp[RG];
            cpu_quant_group_rows(w, row_bytes, g, nr, RG, rp);
            const __m512i vidx = row_index(rp);
            for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const size_t boff = (size_t)b * bb;
                for (int i = 0; i < RG; i++)
                    for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)rp[i] + boff + PF_KQ + o, _MM_HINT_T0);
                /* Q4_K/Q5_K: d | dmin << 16 at offset 0; Q6_K: d in the high half at 206 */
                const __m512i gd = gather_rows(rp, vidx, boff + (is6 ? 206 : 0));
                const __m512 vd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(is6 ? _mm512_srli_epi32(gd, 16) : gd));
                __m512 vdm = _mm512_setzero_ps();
                uint8_t scb[RG * 8] __attribute__((aligned(64)));
                __m512i m02 = _mm512_setzero_si512(), m13 = m02, m46 = m02, m57 = m02;
                if (!is6) {
                    vdm = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(gd, 16)));
                    /* the 6-bit scales and mins of 16 rows at once (quant_k_scale_min) */
                    const __m512i u0 = gather_rows(rp, vidx, boff + 4), u1 = gather_rows(rp, vidx, boff + 8),
                                  u2 = gather_rows(rp, vidx, boff + 12);
                    const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f),
                                  k3 = _mm512_set1_epi32(0x03030303);
                    const __m512i mlo = _mm512_and_si512(u1, k1); /* m0..m3 */
                    const __m512i mhi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
                    const __m512i slo = _mm512_and_si512(u0, k1); /* sc0..sc3 */
                    const __m512i shi = _mm512_or_si512(_mm512_and_si512(u2, k2),
                                                        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
                    const __m512i pi0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                    const __m512i pi1 = _mm512_add_epi32(pi0, _mm512_set1_epi32(8));
                    _mm512_store_si512(scb, _mm512_permutex2var_epi32(slo, pi0, shi));
                    _mm512_store_si512(scb + 64, _mm512_permutex2var_epi32(slo, pi1, shi));
                    /* mins as int16 pairs per row lane: (m0,m2) (m1,m3) (m4,m6) (m5,m7) */
                    const __m512i ff = _mm512_set1_epi32(0x00FF00FF);
                    m02 = _mm512_and_si512(mlo, ff);
                    m13 = _mm512_and_si512(_mm512_srli_epi32(mlo, 8), ff);
                    m46 = _mm512_and_si512(mhi, ff);
                    m57 = _mm512_and_si512(_mm512_srli_epi32(mhi, 8), ff);
                }
                for (int tc = 0; tc < nt;) {
                    const int rem = nt - tc;
                    const int ntc = rem >= 8 ? 8 : rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
                    const block_q8k *y[TCH];
                    __m512i negb[TCH];
                    for (int t = 0; t < ntc; t++) {
                        y[t] = (const block_q8k *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes) + b;
                        negb[t] = is6 ? _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), LDU256(y[t]->bsums)))
                                      : _mm512_setzero_si512();
                    }
                    switch (ntc) {
                    case 8: kq_rows(type, 8, rp, boff, scb, y, negb, psum); break;
                    case 4: kq_rows(type, 4, rp, boff, scb, y, negb, psum); break;
                    case 2: kq_rows(type, 2, rp, boff, scb, y, negb, psum); break;
                    default: kq_rows(type, 1, rp, boff, scb, y, negb, psum); break;
                    }
                    for (int t = 0; t < ntc; t++) {
                        const __m512i I = reduce16(psum[t]);
                        __m512 a = acc[tc + t];
                        a = chain(a, vd, y[t]->d, I);
                        if (!is6) {
                            /* M = sum_j m_j * (bsums[2j] + bsums[2j+1]); m <= 63, |pair| <= 4064 */
                            const int16_t *bs = y[t]->bsums;
                            uint32_t bp[8];
                            for (int j = 0; j < 8; j++) bp[j] = (uint16_t)(int16_t)(bs[2 * j] + bs[2 * j + 1]);
                            __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m02, _mm512_set1_epi32((int)(bp[0] | bp[2] << 16)));
                            M = _mm512_dpwssd_epi32(M, m13, _mm512_set1_epi32((int)(bp[1] | bp[3] << 16)));
                            M = _mm512_dpwssd_epi32(M, m46, _mm512_set1_epi32((int)(bp[4] | bp[6] << 16)));
                            M = _mm512_dpwssd_epi32(M, m57, _mm512_set1_epi32((int)(bp[5] | bp[7] << 16)));
                            a = chain_neg(a, vdm, y[t]->d, M);
                        }
                        acc[tc + t] = a;
                    }
                    tc += ntc;
                }
            }
            for (int t = 0; t < nt; t++)
                _mm512_mask_storeu_ps(out + (size_t)(ts + t) * out_stride + g, row_mask(nr), acc[t]);
        }
    }
}

/* ---- F32 / F16 / BF16: the 32-lane order, lanes 0..15 in a0, 16..31 in a1 ------------- */

AI __m512 fl_load(const int type, const void *w, int e) {
    if (type == QT_F32) return _mm512_loadu_ps((const float *)w + e);
    const __m256i h = LDU256((const uint16_t *)w + e);
    if (type == QT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
AI __m512 fl_load_mask(const int type, const void *w, int e, __mmask16 m) {
    if (type == QT_F32) return _mm512_maskz_loadu_ps(m, (const float *)w + e);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)w + e);
    if (type == QT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* fl_rows' requests for each row's lines ahead (cpu/prefetch.h): none, CPU_STREAM_NEAR_FAR's or
 * CPU_STREAM_TWO_L1's. */
enum { FL_PF_NONE, FL_PF_NEAR_FAR, FL_PF_TWO_L1 };

/* NR rows (row_bytes apart) against NT tokens: per (row, token) the 32-lane fma chains over e
 * ascending (2 x NR x NT independent chains, so the FMA latency is hidden), then the butterfly
 * into o[t][i] for row i. With pf, each row's lines ahead are requested in that form: consecutive
 * rows are one sequential stream, rows far apart one stream each. With touch (one row, f32, in
 * place of pf: CPU_STREAM_TOUCH), each 128-byte step's two lines are first read by 256-bit loads
 * one step ahead of the 512-bit loads that use them. */
AI void fl_rows(const int type, const int NR, const int NT, const uint8_t *wr, size_t row_bytes, const float *const *x,
                int k, float *const *o, const int pf, const bool touch) {
    __m512 A0[4][8], A1[4][8];
    const float *xr[8]; /* in registers: read through x in the loop, they were reloaded from the stack */
    UNROLL for (int t = 0; t < NT; t++) xr[t] = x[t];
    UNROLL for (int i = 0; i < NR; i++) UNROLL for (int t = 0; t < NT; t++) A0[i][t] = A1[i][t] = _mm512_setzero_ps();
    int e = 0;
    const int esz = type == QT_F32 ? 4 : 2;
    if (touch && k >= 32)
        for (int l = 0; l < 32 * esz; l += 64) cpu_touch_line(wr + l);
    for (; e + 32 <= k; e += 32) {
        __m512 w0[4], w1[4];
        if (touch && e + 64 <= k)
            for (int l = 0; l < 32 * esz; l += 64) cpu_touch_line(wr + (size_t)(e + 32) * esz + l);
        UNROLL for (int i = 0; i < NR; i++) {
            const uint8_t *r = wr + (size_t)i * row_bytes;
            if (pf) {
                const int f = pf == FL_PF_TWO_L1 ? CPU_STREAM_TWO_L1 : CPU_STREAM_NEAR_FAR;
                cpu_prefetch_line_form((const char *)r + (size_t)e * esz, f);
                if (esz == 4) cpu_prefetch_line_form((const char *)r + (size_t)e * esz + 64, f);
            }
            w0[i] = fl_load(type, r, e), w1[i] = fl_load(type, r, e + 16);
            if (NT == 1) { /* one token: each row's chains right after its loads, as before the token loop */
                A0[i][0] = _mm512_fmadd_ps(w0[i], _mm512_loadu_ps(xr[0] + e), A0[i][0]);
                A1[i][0] = _mm512_fmadd_ps(w1[i], _mm512_loadu_ps(xr[0] + e + 16), A1[i][0]);
            }
        }
        if (NT == 1) continue;
        /* token by token: each activation vector loaded once for the NR rows, and no more of them
         * live at once (2 x NR x NT accumulators + 2 x NR weights + 2) */
        UNROLL for (int t = 0; t < NT; t++) {
            const __m512 x0 = _mm512_loadu_ps(xr[t] + e), x1 = _mm512_loadu_ps(xr[t] + e + 16);
            UNROLL for (int i = 0; i < NR; i++) {
                A0[i][t] = _mm512_fmadd_ps(w0[i], x0, A0[i][t]);
                A1[i][t] = _mm512_fmadd_ps(w1[i], x1, A1[i][t]);
            }
        }
    }
    if (e < k) {
        const int rem = k - e;
        const __mmask16 m0 = mask16_first(rem), m1 = rem > 16 ? mask16_first(rem - 16) : (__mmask16)0;
        UNROLL for (int i = 0; i < NR; i++) {
            const uint8_t *r = wr + (size_t)i * row_bytes;
            const __m512 w0 = fl_load_mask(type, r, e, m0), w1 = fl_load_mask(type, r, e + 16, m1);
            UNROLL for (int t = 0; t < NT; t++) {
                A0[i][t] = _mm512_mask3_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, xr[t] + e), A0[i][t], m0);
                A1[i][t] = _mm512_mask3_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, xr[t] + e + 16), A1[i][t], m1);
            }
        }
    }
    UNROLL for (int i = 0; i < NR; i++) UNROLL for (int t = 0; t < NT; t++) o[t][i] = butterfly32_zmm(A0[i][t], A1[i][t]);
}

#define FL_TCH 6  /* tokens per chunk: two rows x six tokens are 24 of the 32 vector registers */
#define FL_TSUP 24 /* tokens per pass over the rows (their activations, 192 KiB at k 2048, stay in L2) */
#define FL_ONE_ROW_TOK 3 /* with one1, up to this many tokens (24 KiB of activations at k 2048, in L1) one row at a time */

/* One token: four rows at a time (enough independent chains); with one1 (the plain stream
 * form), one row at a time; with two (the two-l1 form), the call's rows in two halves read in
 * lockstep, a row of each at a time, each half one stream with two-l1's requests (on the Zen 5
 * host 0.91-0.96x the four rows' time on router-shaped matrices from memory, bench/cpu-speed-log.md,
 * forty-seventh session). Four rows are four streams 8 KiB apart (k 2048): on the Zen 4 host,
 * where the probe read 4 interleaved streams a thread at ~0.6 of one, the router stage read
 * 24-26 GB/s against 29-42 for the other gemm stages, and 31-32 (as theirs) one row at a time;
 * its two chains still keep ~32 bytes a cycle in flight, several times a core's share of memory
 * (bench/cpu-speed-log.md, twenty-ninth session).
 * More tokens: passes of up to FL_TSUP tokens over the rows, each pass cut into even chunks of at
 * most FL_TCH; two rows at a time, and each pair runs every chunk of the pass while its rows are
 * in L1/L2, so a pass reads the weights from memory once (chunks of eight tokens, each a pass of
 * its own, read them twice at 16 streams) and each activation vector loaded serves two rows. With
 * one1, two or three tokens go one row at a time: their activations stay in L1, so the row is the
 * thread's one stream. In one process (48 router-shaped 128 x 2048 matrices from memory, two
 * threads, Zen 4): 2 tokens 0.66x the time of the old code, 3 0.85x, 8 0.87-0.89x, 16 0.71-0.74x,
 * 128 0.60-0.63x; 1, 4 and 6 the same (bench/cpu-speed-log.md, thirtieth session).
 * The rows' and tokens' order of work never changes a bit: every (row, token) is its own chains. */
AI void gemm_fl(const int type, const bool one1, const bool touch, const bool two, GEMM_ARGS) {
    const float *x[FL_TSUP];
    float *o[FL_TSUP];
#define FL_CASE(NR, NT) \
    case (NR) * 16 + (NT): fl_rows(type, NR, NT, wr, row_bytes, xc, k, oc, c == 0 ? FL_PF_NEAR_FAR : FL_PF_NONE, false); break
    if (n_tok == 1) {
        const float *const x1[1] = {(const float *)act};
        if (two) {
            const int h = (r1 - r0) / 2; /* rows r0 + i and r0 + h + i together; an odd last row alone */
            for (int i = 0; i < h; i++) {
                float pair[2];
                float *const o1[1] = {pair};
                fl_rows(type, 2, 1, (const uint8_t *)w + (size_t)(r0 + i) * row_bytes, (size_t)h * row_bytes, x1, k,
                        o1, FL_PF_TWO_L1, false);
                out[r0 + i] = pair[0], out[r0 + h + i] = pair[1];
            }
            if (r0 + 2 * h < r1) {
                float *const o1[1] = {out + r1 - 1};
                fl_rows(type, 1, 1, (const uint8_t *)w + (size_t)(r1 - 1) * row_bytes, row_bytes, x1, k, o1,
                        FL_PF_TWO_L1, false);
            }
            return;
        }
        for (int r = r0; r < r1;) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
            float *const o1[1] = {out + r};
            if (!one1 && r1 - r >= 4)
                fl_rows(type, 4, 1, wr, row_bytes, x1, k, o1, FL_PF_NEAR_FAR, false), r += 4;
            else
                fl_rows(type, 1, 1, wr, row_bytes, x1, k, o1, touch ? FL_PF_NONE : FL_PF_NEAR_FAR, touch), r++;
        }
        return;
    }
    for (int ts = 0; ts < n_tok; ts += FL_TSUP) {
        const int nt = DT_MIN(FL_TSUP, n_tok - ts), nch = (nt + FL_TCH - 1) / FL_TCH;
        const int nr = one1 && nt <= FL_ONE_ROW_TOK ? 1 : 2;
        int tb[FL_TSUP / FL_TCH + 1]; /* chunk c is tokens [tb[c], tb[c+1]): an even cut, sizes differ by at most one */
        for (int c = 0; c <= nch; c++) tb[c] = nt * c / nch;
        for (int t = 0; t < nt; t++) x[t] = (const float *)((const uint8_t *)act + (size_t)(ts + t) * act_bytes);
        for (int r = r0; r < r1;) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
            const int n = r1 - r >= nr ? nr : 1;
            for (int t = 0; t < nt; t++) o[t] = out + (size_t)(ts + t) * out_stride + r;
            for (int c = 0; c < nch; c++) {
                const float *const *xc = x + tb[c];
                float *const *oc = o + tb[c];
                switch (n * 16 + tb[c + 1] - tb[c]) {
                    FL_CASE(2, 1); FL_CASE(2, 2); FL_CASE(2, 3); FL_CASE(2, 4); FL_CASE(2, 5);
                    FL_CASE(2, 6); FL_CASE(1, 1); FL_CASE(1, 2); FL_CASE(1, 3); FL_CASE(1, 4); FL_CASE(1, 5);
                    FL_CASE(1, 6);
                default: DT_ASSERT(0);
                }
            }
            r += n;
        }
    }
#undef FL_CASE
}

/* ---- kernels and table ------------------------------------------------------------ */

#define DEF_GEMM(name, body, type) \
    static void name(GEMM_ARGS) { body(type, GEMM_PASS); }
DEF_GEMM(gemm_q4_0_avx512, gemm_legacy, QT_Q4_0)
DEF_GEMM(gemm_q4_1_avx512, gemm_legacy, QT_Q4_1)
DEF_GEMM(gemm_q5_0_avx512, gemm_legacy, QT_Q5_0)
DEF_GEMM(gemm_q5_1_avx512, gemm_legacy, QT_Q5_1)
DEF_GEMM(gemm_q8_0_avx512, gemm_legacy, QT_Q8_0)
DEF_GEMM(gemm_q4_K_avx512, gemm_kq, QT_Q4_K)
DEF_GEMM(gemm_q5_K_avx512, gemm_kq, QT_Q5_K)
DEF_GEMM(gemm_q6_K_avx512, gemm_kq, QT_Q6_K)
#define DEF_GEMM_FL(name, type, one1, touch, two) \
    static void name(GEMM_ARGS) { gemm_fl(type, one1, touch, two, GEMM_PASS); }
DEF_GEMM_FL(gemm_f32_avx512, QT_F32, false, false, false)
DEF_GEMM_FL(gemm_f16_avx512, QT_F16, false, false, false)
DEF_GEMM_FL(gemm_bf16_avx512, QT_BF16, false, false, false)
DEF_GEMM_FL(gemm_f32_one1_avx512, QT_F32, true, false, false)
DEF_GEMM_FL(gemm_f16_one1_avx512, QT_F16, true, false, false)
DEF_GEMM_FL(gemm_bf16_one1_avx512, QT_BF16, true, false, false)
DEF_GEMM_FL(gemm_f32_touch_avx512, QT_F32, true, true, false)
DEF_GEMM_FL(gemm_f32_two_avx512, QT_F32, false, false, true)
DEF_GEMM_FL(gemm_f16_two_avx512, QT_F16, false, false, true)
DEF_GEMM_FL(gemm_bf16_two_avx512, QT_BF16, false, false, true)

quant_gemm_fn quant_gemm_avx512(uint32_t type) {
    switch (type) {
    case QT_F32: return gemm_f32_avx512;
    case QT_F16: return gemm_f16_avx512;
    case QT_BF16: return gemm_bf16_avx512;
    case QT_Q4_0: return gemm_q4_0_avx512;
    case QT_Q4_1: return gemm_q4_1_avx512;
    case QT_Q5_0: return gemm_q5_0_avx512;
    case QT_Q5_1: return gemm_q5_1_avx512;
    case QT_Q8_0: return gemm_q8_0_avx512;
    case QT_Q4_K: return gemm_q4_K_avx512;
    case QT_Q5_K: return gemm_q5_K_avx512;
    case QT_Q6_K: return gemm_q6_K_avx512;
    default: return NULL;
    }
}

quant_gemm_fn quant_gemm_avx512_form(uint32_t type, enum cpu_stream form) {
    if (form == CPU_STREAM_TWO_L1) switch (type) {
        case QT_F32: return gemm_f32_two_avx512;
        case QT_F16: return gemm_f16_two_avx512;
        case QT_BF16: return gemm_bf16_two_avx512;
        default: return NULL;
        }
    if (!cpu_stream_no_requests(form)) return NULL;
    switch (type) {
    case QT_F32: return form == CPU_STREAM_TOUCH ? gemm_f32_touch_avx512 : gemm_f32_one1_avx512;
    case QT_F16: return gemm_f16_one1_avx512;
    case QT_BF16: return gemm_bf16_one1_avx512;
    default: return NULL;
    }
}

/* ---- activation quantization ------------------------------------------------------------
 * Per block: amax = max|x| (max is exact in any order), d = amax/127.0f, q = clamp(
 * roundscale_nearest(x/d), +-127): equal to quant_rint's magic-number rounding for
 * |x/d| < 2^22, which holds whenever d > 0 is finite. Blocks with NaN, an infinite amax
 * or d underflowing to 0 go to the scalar reference. */

/* n16 vectors of 16 floats at x -> q (n16*16 int8); returns 0 and leaves q undefined if the
 * block needs the scalar path. isum[v] = sum of q over vector v. */
AI int qblock(const float *x, const int n16, int8_t *q, float *dout, __m512i *isum) {
    __m512 xv[16];
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    const __m512 absm = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    for (int v = 0; v < n16; v++) {
        xv[v] = _mm512_loadu_ps(x + 16 * v);
        nan |= _mm512_cmp_ps_mask(xv[v], xv[v], _CMP_UNORD_Q);
        mx = _mm512_max_ps(_mm512_and_ps(xv[v], absm), mx);
    }
    const float amax = _mm512_reduce_max_ps(mx); /* max: exact, order-free (no NaN here) */
    if (nan || !(amax <= 3.40282347e38f)) return 0;
    const float d = amax / 127.0f;
    if (amax == 0.0f) {
        memset(q, 0, (size_t)n16 * 16);
        *dout = 0.0f;
        for (int v = 0; v < n16; v++) isum[v] = _mm512_setzero_si512();
        return 1;
    }
    if (d == 0.0f) return 0;
    const __m512 vd = _mm512_set1_ps(d), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (int v = 0; v < n16; v++) {
        __m512 r = _mm512_roundscale_ps(_mm512_div_ps(xv[v], vd), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        const __m512i qi = _mm512_cvttps_epi32(r);
        _mm_storeu_si128((__m128i *)(void *)(q + 16 * v), _mm512_cvtepi32_epi8(qi));
        isum[v] = qi;
    }
    *dout = d;
    return 1;
}

void quant_act_row_avx512(enum quant_act act, const float *x, void *dst, int64_t k) {
    if (act == QA_F32) {
        memcpy(dst, x, (size_t)k * 4);
    } else if (act == QA_Q8_32) {
        block_q8a *b = dst;
        for (int64_t i = 0; i < k / QK32; i++) {
            __m512i is[2];
            float d;
            if (!qblock(x + i * QK32, 2, b[i].q, &d, is)) {
                quant_act_row(act, x + i * QK32, &b[i], QK32);
                continue;
            }
            b[i].d = d;
            b[i].s = _mm512_reduce_add_epi32(_mm512_add_epi32(is[0], is[1])); /* int: exact */
        }
    } else {
        block_q8k *b = dst;
        for (int64_t i = 0; i < k / QK_K; i++) {
            __m512i is[16];
            float d;
            if (!qblock(x + i * QK_K, 16, b[i].q, &d, is)) {
                quant_act_row(act, x + i * QK_K, &b[i], QK_K);
                continue;
            }
            b[i].d = d;
            _mm256_storeu_si256((__m256i *)(void *)b[i].bsums, _mm512_cvtepi32_epi16(reduce16(is)));
        }
    }
}
