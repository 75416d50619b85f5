/* quant_avx2.c — AVX2 (+FMA, F16C) gemm and activation-quantization kernels, bitwise
 * equal to the scalar reference in quant.c.
 *
 * Same design as quant_avx512.c with 8 rows per group (SIMD lane = row): exact int32
 * block sums per row by vpmaddubsw (u8 weights x s8 activations; every int16 pair sum
 * is bounded below 2^15 as noted at each use) and vpmaddwd, a transposed reduction of
 * 8 rows' partial vectors into one vector of row sums, then the reference's fp32
 * chain per lane. A weight block is unpacked once per chunk of tokens; scales come in
 * by dword gathers over the 8 rows, and each row stream is prefetched ahead. */
#include <immintrin.h>
#include <string.h>

#include "cpu/cpu_quant.h"
#include "cpu/exp_avx2.h"
#include "cpu/prefetch.h"

#define AI static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define RG 8    /* rows per group = fp32 lanes */
#define TCH 8   /* tokens per chunk (legacy types) */
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
#define LDU256(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define LDU128(p) _mm_loadu_si128((const __m128i *)(const void *)(p))

/* ---- transposed reductions ---------------------------------------------------------- */

/* p0..p3 -> per 128-bit lane L: [sum p0.L, sum p1.L, sum p2.L, sum p3.L]. */
AI __m256i hsum4_128(__m256i p0, __m256i p1, __m256i p2, __m256i p3) {
    __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(p0, p1), _mm256_unpackhi_epi32(p0, p1));
    __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(p2, p3), _mm256_unpackhi_epi32(p2, p3));
    return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
}
/* 8 vectors (row i in p[i]) -> lane i = sum of the 8 lanes of p[i]. */
AI __m256i reduce8(const __m256i *p) {
    const __m256i u0 = hsum4_128(p[0], p[1], p[2], p[3]), u1 = hsum4_128(p[4], p[5], p[6], p[7]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

AI __m256 chain(__m256 acc, __m256 dw, float da, __m256i I) {
    return _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(I), acc);
}
AI __m256 chain_neg(__m256 acc, __m256 dm, float da, __m256i M) {
    __m256 p = _mm256_mul_ps(dm, _mm256_set1_ps(da));
    p = _mm256_xor_ps(p, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    return _mm256_fmadd_ps(p, _mm256_cvtepi32_ps(M), acc);
}

#define PF_LEG 512 /* prefetch distance per row, bytes */
#define PF_KQ 512

/* Byte offsets of the 8 row pointers from rp[0] as int32, or -1 in lane 0 when they do
 * not fit (then gather_rows loads them one by one). */
static inline __m256i row_index(const uint8_t *const *rp) {
    int32_t idx[RG];
    for (int i = 0; i < RG; i++) {
        const ptrdiff_t d = rp[i] - rp[0];
        if (d < 0 || d > 0x7fffffff) return _mm256_set1_epi32(-1);
        idx[i] = (int32_t)d;
    }
    return _mm256_loadu_si256((const __m256i *)(const void *)idx);
}
/* The dword at rp[i] + off of each row. */
AI __m256i gather_rows(const uint8_t *const *rp, __m256i vidx, size_t off) {
    if (__builtin_expect(_mm_cvtsi128_si32(_mm256_castsi256_si128(vidx)) == 0, 1))
        return _mm256_i32gather_epi32((const int *)(const void *)(rp[0] + off), vidx, 1);
    uint32_t v[RG];
    for (int i = 0; i < RG; i++) v[i] = ld32(rp[i] + off);
    return _mm256_loadu_si256((const __m256i *)(const void *)v);
}
/* fp16 in the low half of each dword -> fp32 (exact) */
AI __m256 cvt_lo16(__m256i v) {
    const __m256i p = _mm256_packus_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)), _mm256_setzero_si256());
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
}

static inline void store_rows(float *o, int nr, __m256 v) {
    if (nr == RG) {
        _mm256_storeu_ps(o, v);
    } else {
        float tmp[RG];
        _mm256_storeu_ps(tmp, v);
        memcpy(o, tmp, (size_t)nr * 4);
    }
}

/* ---- legacy 32-blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 ------------------------------------
 * One block per ymm in element order. Q4/Q5: u8 weights (q <= 31) x s8 activations,
 * |pair| <= 2*31*127 < 2^15; offsets q-8 / q-16 corrected with the block sum s.
 * Q8_0: sign trick maddubs(|w|, sign(a, w)): |pair| <= 2*128*127 = 32512 < 2^15. */

AI size_t leg_bytes(int type) {
    return type == QT_Q4_0 ? 18 : type == QT_Q4_1 ? 20 : type == QT_Q5_0 ? 22 : type == QT_Q5_1 ? 24 : 34;
}
AI int leg_off(int type) { return type == QT_Q4_0 ? 8 : type == QT_Q5_0 ? 16 : 0; }

/* byte i = 0xFF where bit i of h is set */
AI __m256i bits32_to_bytes(uint32_t h) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                           0x0101010101010101LL, 0x0000000000000000LL);
    const __m256i sel = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), shuf);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

AI __m256i leg_unpack(const int type, const uint8_t *x) {
    if (type == QT_Q8_0) return LDU256(x + 2);
    const int qs = type == QT_Q4_0 ? 2 : type == QT_Q4_1 ? 4 : type == QT_Q5_0 ? 6 : 8;
    const __m128i q = LDU128(x + qs);
    __m256i z = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1),
                                 _mm256_set1_epi8(0x0F));
    if (type == QT_Q5_0 || type == QT_Q5_1) {
        const int qh = type == QT_Q5_0 ? 2 : 4;
        z = _mm256_or_si256(z, _mm256_and_si256(bits32_to_bytes(ld32(x + qh)), _mm256_set1_epi8(0x10)));
    }
    return z;
}

AI void gemm_legacy(const int type, GEMM_ARGS) {
    const int nb = k / QK32;
    const size_t bb = leg_bytes(type);
    const int has_m = type == QT_Q4_1 || type == QT_Q5_1;
    const int off = leg_off(type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i psum[TCH][RG];
    __m256 acc[TSUP];
    for (int ts = 0; ts < n_tok; ts += TSUP) {
        const int nt = DT_MIN(TSUP, n_tok - ts);
        for (int g = r0; g < r1; g += RG) {
            const int nr = DT_MIN(RG, r1 - g);
            const uint8_t *rp[RG];
            cpu_quant_group_rows(w, row_bytes, g, nr, RG, rp);
            const __m256i vidx = row_index(rp);
            for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const size_t boff = (size_t)b * bb;
                for (int i = 0; i < RG; i++) _mm_prefetch((const char *)rp[i] + boff + PF_LEG, _MM_HINT_T0);
                /* d (and m) of the 8 rows: dword gather, fp16 in the low (high) half */
                const __m256i gd = gather_rows(rp, vidx, boff);
                const __m256 vd = cvt_lo16(gd);
                const __m256 vm = has_m ? cvt_lo16(_mm256_srli_epi32(gd, 16)) : _mm256_setzero_ps();
                for (int tc = 0; tc < nt; tc += TCH) {
                    const int ntc = DT_MIN(TCH, nt - tc);
                    const block_q8a *y[TCH];
                    for (int t = 0; t < ntc; t++)
                        y[t] = (const block_q8a *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes) + b;
                    for (int i = 0; i < RG; i++) {
                        const __m256i W = leg_unpack(type, rp[i] + boff);
                        if (type == QT_Q8_0) {
                            const __m256i aw = _mm256_sign_epi8(W, W);
                            for (int t = 0; t < ntc; t++)
                                psum[t][i] = _mm256_madd_epi16(
                                    _mm256_maddubs_epi16(aw, _mm256_sign_epi8(LDU256(y[t]->q), W)), ones);
                        } else {
                            for (int t = 0; t < ntc; t++)
                                psum[t][i] = _mm256_madd_epi16(_mm256_maddubs_epi16(W, LDU256(y[t]->q)), ones);
                        }
                    }
                    for (int t = 0; t < ntc; t++) {
                        __m256i I = reduce8(psum[t]);
                        if (off) I = _mm256_sub_epi32(I, _mm256_set1_epi32(off * y[t]->s));
                        __m256 a = chain(acc[tc + t], vd, y[t]->d, I);
                        if (has_m)
                            a = _mm256_fmadd_ps(_mm256_mul_ps(vm, _mm256_set1_ps(y[t]->d)),
                                                _mm256_set1_ps((float)y[t]->s), a);
                        acc[tc + t] = a;
                    }
                }
            }
            for (int t = 0; t < nt; t++) store_rows(out + (size_t)(ts + t) * out_stride + g, nr, acc[t]);
        }
    }
}

/* ---- K-quants: Q4_K, Q5_K, Q6_K ---------------------------------------------------------
 * Per 32-element sub-block (Q6_K: pair of 16-element sub-blocks): maddubs of u8 weights
 * (<= 63) with s8 activations (|pair| <= 16002), madd with the int16 scales, int32 add.
 * Q6_K's -32 offset is -32*sum_j sc_j*bsum_j: one madd of (sc<<5) with -bsums. */

AI size_t kq_bytes(int type) { return type == QT_Q4_K ? 144 : type == QT_Q5_K ? 176 : 210; }

/* psum[t][i] = partial int32 vector of row i (block at rp[i]+boff) x token t.
 * scw: the 8 scales of each row as int16 (Q4_K/Q5_K); Q6_K reads its int8 scales itself. */
AI void kq_rows(const int type, const int NT, const uint8_t *const *rp, size_t boff,
                const int16_t *scw, const block_q8k *const *y, const __m256i *negb,
                __m256i (*psum)[RG]) {
    const __m256i m0f = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < RG; i++) {
        const uint8_t *blk = rp[i] + boff;
        __m256i P[4];
        UNROLL for (int t = 0; t < NT; t++) P[t] = _mm256_setzero_si256();
        if (type == QT_Q6_K) {
            const __m256i s16 = _mm256_cvtepi8_epi16(LDU128(blk + 192));
            const __m256i m30 = _mm256_set1_epi8(0x30);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                const __m256i SS = h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00);
                const __m256i L0 = LDU256(blk + 64 * h), L1 = LDU256(blk + 64 * h + 32);
                const __m256i H = LDU256(blk + 128 + 32 * h);
                _Pragma("GCC unroll 4") for (int m = 0; m < 4; m++) {
                    __m256i W;
                    if (m == 0) W = _mm256_or_si256(_mm256_and_si256(L0, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                    else if (m == 1) W = _mm256_or_si256(_mm256_and_si256(L1, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                    else if (m == 2) W = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m0f), _mm256_and_si256(H, m30));
                    else W = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m0f), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                    /* int16 lanes 0..7: sub-block 8h+2m, 8..15: 8h+2m+1 */
                    const char b0 = (char)(4 * m), b1 = (char)(4 * m + 1), b2 = (char)(4 * m + 2), b3 = (char)(4 * m + 3);
                    const __m256i ctl = _mm256_setr_epi8(b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1,
                                                         b2, b3, b2, b3, b2, b3, b2, b3, b2, b3, b2, b3, b2, b3, b2, b3);
                    const __m256i S = _mm256_shuffle_epi8(SS, ctl);
                    UNROLL for (int t = 0; t < NT; t++)
                        P[t] = _mm256_add_epi32(P[t], _mm256_madd_epi16(_mm256_maddubs_epi16(W, LDU256(y[t]->q + 128 * h + 32 * m)), S));
                }
            }
            const __m256i s32 = _mm256_slli_epi16(s16, 5); /* |sc<<5| <= 4096, |bsum| <= 2032 */
            UNROLL for (int t = 0; t < NT; t++) P[t] = _mm256_add_epi32(P[t], _mm256_madd_epi16(s32, negb[t]));
        } else {
            const int qs = type == QT_Q4_K ? 16 : 48;
            __m256i H = _mm256_setzero_si256();
            if (type == QT_Q5_K) H = LDU256(blk + 16);
            const __m256i m10 = _mm256_set1_epi8(0x10);
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {
                const __m256i G = LDU256(blk + qs + 32 * c);
                __m256i Wl = _mm256_and_si256(G, m0f), Wh = _mm256_and_si256(_mm256_srli_epi16(G, 4), m0f);
                if (type == QT_Q5_K) {
                    /* 5th bit of sub-block j = bit j of qh[l], moved to bit 4 */
                    const __m256i hl = _mm256_slli_epi16(_mm256_srli_epi16(H, 2 * c), 4);
                    const __m256i hh = _mm256_slli_epi16(_mm256_srli_epi16(H, 2 * c + 1), 4);
                    Wl = _mm256_or_si256(Wl, _mm256_and_si256(hl, m10));
                    Wh = _mm256_or_si256(Wh, _mm256_and_si256(hh, m10));
                }
                const __m256i Sl = _mm256_set1_epi16(scw[8 * i + 2 * c]), Sh = _mm256_set1_epi16(scw[8 * i + 2 * c + 1]);
                UNROLL for (int t = 0; t < NT; t++) {
                    const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(Wl, LDU256(y[t]->q + 64 * c)), Sl);
                    const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(Wh, LDU256(y[t]->q + 64 * c + 32)), Sh);
                    P[t] = _mm256_add_epi32(P[t], _mm256_add_epi32(pl, ph));
                }
            }
        }
        UNROLL for (int t = 0; t < NT; t++) psum[t][i] = P[t];
    }
}

AI void gemm_kq(const int type, GEMM_ARGS) {
    const int nb = k / QK_K;
    const size_t bb = kq_bytes(type);
    const int is6 = type == QT_Q6_K;
    __m256i psum[4][RG];
    __m256 acc[TSUP];
    for (int ts = 0; ts < n_tok; ts += TSUP) {
        const int nt = DT_MIN(TSUP, n_tok - ts);
        for (int g = r0; g < r1; g += RG) {
            const int nr = DT_MIN(RG, r1 - g);
            const uint8_t *rp[RG];
            cpu_quant_group_rows(w, row_bytes, g, nr, RG, rp);
            const __m256i vidx = row_index(rp);
            for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < nb; b++) {
                const size_t boff = (size_t)b * bb;
                for (int i = 0; i < RG; i++)
                    for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)rp[i] + boff + PF_KQ + o, _MM_HINT_T0);
                /* Q4_K/Q5_K: d | dmin << 16 at offset 0; Q6_K: d in the high half at 206 */
                const __m256i gd = gather_rows(rp, vidx, boff + (is6 ? 206 : 0));
                const __m256 vd = cvt_lo16(is6 ? _mm256_srli_epi32(gd, 16) : gd);
                __m256 vdm = _mm256_setzero_ps();
                int16_t scw[RG * 8] __attribute__((aligned(32)));
                __m256i m02 = _mm256_setzero_si256(), m13 = m02, m46 = m02, m57 = m02;
                if (!is6) {
                    vdm = cvt_lo16(_mm256_srli_epi32(gd, 16));
                    /* the 6-bit scales and mins of 8 rows at once (quant_k_scale_min) */
                    const __m256i u0 = gather_rows(rp, vidx, boff + 4), u1 = gather_rows(rp, vidx, boff + 8),
                                  u2 = gather_rows(rp, vidx, boff + 12);
                    const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f),
                                  k3 = _mm256_set1_epi32(0x03030303);
                    const __m256i mlo = _mm256_and_si256(u1, k1); /* m0..m3 */
                    const __m256i mhi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                                                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4));
                    const __m256i slo = _mm256_and_si256(u0, k1); /* sc0..sc3 */
                    const __m256i shi = _mm256_or_si256(_mm256_and_si256(u2, k2),
                                                        _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4));
                    /* rows 4L, 4L+1 in lo, 4L+2, 4L+3 in hi (128-bit lane L) */
                    const __m256i lo = _mm256_unpacklo_epi32(slo, shi), hi = _mm256_unpackhi_epi32(slo, shi);
                    _mm256_store_si256((__m256i *)(void *)(scw + 0), _mm256_cvtepu8_epi16(_mm256_castsi256_si128(lo)));
                    _mm256_store_si256((__m256i *)(void *)(scw + 16), _mm256_cvtepu8_epi16(_mm256_castsi256_si128(hi)));
                    _mm256_store_si256((__m256i *)(void *)(scw + 32), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(lo, 1)));
                    _mm256_store_si256((__m256i *)(void *)(scw + 48), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(hi, 1)));
                    /* mins as int16 pairs per row lane: (m0,m2) (m1,m3) (m4,m6) (m5,m7) */
                    const __m256i ff = _mm256_set1_epi32(0x00FF00FF);
                    m02 = _mm256_and_si256(mlo, ff);
                    m13 = _mm256_and_si256(_mm256_srli_epi32(mlo, 8), ff);
                    m46 = _mm256_and_si256(mhi, ff);
                    m57 = _mm256_and_si256(_mm256_srli_epi32(mhi, 8), ff);
                }
                for (int tc = 0; tc < nt;) {
                    const int rem = nt - tc;
                    const int ntc = rem >= 4 ? 4 : rem >= 2 ? 2 : 1;
                    const block_q8k *y[4];
                    __m256i negb[4];
                    for (int t = 0; t < ntc; t++) {
                        y[t] = (const block_q8k *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes) + b;
                        negb[t] = is6 ? _mm256_sub_epi16(_mm256_setzero_si256(), LDU256(y[t]->bsums)) : _mm256_setzero_si256();
                    }
                    switch (ntc) {
                    case 4: kq_rows(type, 4, rp, boff, scw, y, negb, psum); break;
                    case 2: kq_rows(type, 2, rp, boff, scw, y, negb, psum); break;
                    default: kq_rows(type, 1, rp, boff, scw, y, negb, psum); break;
                    }
                    for (int t = 0; t < ntc; t++) {
                        const __m256i I = reduce8(psum[t]);
                        __m256 a = chain(acc[tc + t], vd, y[t]->d, I);
                        if (!is6) {
                            /* M = sum_j m_j * (bsums[2j] + bsums[2j+1]); m <= 63, |pair| <= 4064 */
                            const int16_t *bs = y[t]->bsums;
                            uint32_t bp[8];
                            for (int j = 0; j < 8; j++) bp[j] = (uint16_t)(int16_t)(bs[2 * j] + bs[2 * j + 1]);
                            const __m256i M = _mm256_add_epi32(
                                _mm256_add_epi32(_mm256_madd_epi16(m02, _mm256_set1_epi32((int)(bp[0] | bp[2] << 16))),
                                                 _mm256_madd_epi16(m13, _mm256_set1_epi32((int)(bp[1] | bp[3] << 16)))),
                                _mm256_add_epi32(_mm256_madd_epi16(m46, _mm256_set1_epi32((int)(bp[4] | bp[6] << 16))),
                                                 _mm256_madd_epi16(m57, _mm256_set1_epi32((int)(bp[5] | bp[7] << 16)))));
                            a = chain_neg(a, vdm, y[t]->d, M);
                        }
                        acc[tc + t] = a;
                    }
                    tc += ntc;
                }
            }
            for (int t = 0; t < nt; t++) store_rows(out + (size_t)(ts + t) * out_stride + g, nr, acc[t]);
        }
    }
}

/* ---- F32 / F16 / BF16: the 32-lane order in 4 ymm (lanes 0-7, 8-15, 16-23, 24-31) ------ */

AI __m256 fl_load(const int type, const void *w, int e) {
    if (type == QT_F32) return _mm256_loadu_ps((const float *)w + e);
    const __m128i h = LDU128((const uint16_t *)w + e);
    if (type == QT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* One row against NT tokens: per token the 32-lane fma chains over e ascending, then the
 * butterfly. With pf, each 64 bytes of the row has the lines 1 KiB ahead (L1) and 8 KiB ahead
 * (L2) requested (cpu/prefetch.h's two-request form): the rows are one sequential stream. */
AI void fl_row(const int type, const int NT, const uint8_t *wr, const float *const *x, int k,
               float *const *o, const bool pf) {
    __m256 A[2][4];
    UNROLL for (int t = 0; t < NT; t++)
        UNROLL for (int j = 0; j < 4; j++) A[t][j] = _mm256_setzero_ps();
    const int esz = type == QT_F32 ? 4 : 2;
    int e = 0;
    for (; e + 32 <= k; e += 32) {
        if (pf) {
            cpu_prefetch_line((const char *)wr + (size_t)e * esz);
            if (esz == 4) cpu_prefetch_line((const char *)wr + (size_t)e * esz + 64);
        }
        __m256 wv[4];
        UNROLL for (int j = 0; j < 4; j++) wv[j] = fl_load(type, wr, e + 8 * j);
        UNROLL for (int t = 0; t < NT; t++)
            UNROLL for (int j = 0; j < 4; j++) A[t][j] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(x[t] + e + 8 * j), A[t][j]);
    }
    if (e < k) {
        /* tail: zero-padded copies, and lanes past k keep their accumulator */
        const int rem = k - e;
        float xt[32], wt[32];
        uint16_t ht[32];
        memset(ht, 0, sizeof ht);
        if (type == QT_F32) {
            memset(wt, 0, sizeof wt);
            memcpy(wt, (const float *)wr + e, (size_t)rem * 4);
        } else {
            memcpy(ht, (const uint16_t *)wr + e, (size_t)rem * 2);
        }
        __m256 wv[4], mk[4];
        UNROLL for (int j = 0; j < 4; j++) {
            wv[j] = type == QT_F32 ? _mm256_loadu_ps(wt + 8 * j) : fl_load(type, ht, 8 * j);
            const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32(8 * j), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            mk[j] = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(rem), lane));
        }
        UNROLL for (int t = 0; t < NT; t++) {
            memset(xt, 0, sizeof xt);
            memcpy(xt, x[t] + e, (size_t)rem * 4);
            UNROLL for (int j = 0; j < 4; j++)
                A[t][j] = _mm256_blendv_ps(A[t][j], _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xt + 8 * j), A[t][j]), mk[j]);
        }
    }
    UNROLL for (int t = 0; t < NT; t++) *o[t] = butterfly32_ymm(A[t][0], A[t][1], A[t][2], A[t][3]);
}

#define FL_TCH 8 /* tokens whose rows are computed while a weight row is in L1 */

/* Chunks of up to FL_TCH tokens; within a chunk each weight row is read once (from memory,
 * requested ahead by the first token pair) and kept in L1 for the chunk's other pairs. */
AI void gemm_fl(const int type, GEMM_ARGS) {
    for (int tc = 0; tc < n_tok; tc += FL_TCH) {
        const int nc = n_tok - tc < FL_TCH ? n_tok - tc : FL_TCH;
        const float *x[FL_TCH];
        for (int t = 0; t < nc; t++) x[t] = (const float *)((const uint8_t *)act + (size_t)(tc + t) * act_bytes);
        for (int r = r0; r < r1; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * row_bytes;
            for (int t0 = 0; t0 < nc; t0 += 2) {
                float *o[2];
                const int nt = nc - t0 >= 2 ? 2 : 1;
                for (int t = 0; t < nt; t++) o[t] = out + (size_t)(tc + t0 + t) * out_stride + r;
                if (nt == 2) fl_row(type, 2, wr, x + t0, k, o, t0 == 0);
                else fl_row(type, 1, wr, x + t0, k, o, t0 == 0);
            }
        }
    }
}

/* ---- kernels and table ------------------------------------------------------------ */

#define DEF_GEMM(name, body, type) \
    static void name(GEMM_ARGS) { body(type, GEMM_PASS); }
DEF_GEMM(gemm_q4_0_avx2, gemm_legacy, QT_Q4_0)
DEF_GEMM(gemm_q4_1_avx2, gemm_legacy, QT_Q4_1)
DEF_GEMM(gemm_q5_0_avx2, gemm_legacy, QT_Q5_0)
DEF_GEMM(gemm_q5_1_avx2, gemm_legacy, QT_Q5_1)
DEF_GEMM(gemm_q8_0_avx2, gemm_legacy, QT_Q8_0)
DEF_GEMM(gemm_q4_K_avx2, gemm_kq, QT_Q4_K)
DEF_GEMM(gemm_q5_K_avx2, gemm_kq, QT_Q5_K)
DEF_GEMM(gemm_q6_K_avx2, gemm_kq, QT_Q6_K)
DEF_GEMM(gemm_f32_avx2, gemm_fl, QT_F32)
DEF_GEMM(gemm_f16_avx2, gemm_fl, QT_F16)
DEF_GEMM(gemm_bf16_avx2, gemm_fl, QT_BF16)

quant_gemm_fn quant_gemm_avx2(uint32_t type) {
    switch (type) {
    case QT_F32: return gemm_f32_avx2;
    case QT_F16: return gemm_f16_avx2;
    case QT_BF16: return gemm_bf16_avx2;
    case QT_Q4_0: return gemm_q4_0_avx2;
    case QT_Q4_1: return gemm_q4_1_avx2;
    case QT_Q5_0: return gemm_q5_0_avx2;
    case QT_Q5_1: return gemm_q5_1_avx2;
    case QT_Q8_0: return gemm_q8_0_avx2;
    case QT_Q4_K: return gemm_q4_K_avx2;
    case QT_Q5_K: return gemm_q5_K_avx2;
    case QT_Q6_K: return gemm_q6_K_avx2;
    default: return NULL;
    }
}

/* ---- activation quantization (see quant_avx512.c for the argument) ---------------------- */

AI float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
AI int hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* n8 vectors of 8 floats (n8 a multiple of 4) -> q; sum16[j] = sum of q over 16 values j
 * (n8/2 of them). Returns 0 if the block needs the scalar path. */
AI int qblock(const float *x, const int n8, int8_t *q, float *dout, int *sum16) {
    __m256 mx = _mm256_setzero_ps();
    __m256 nan = _mm256_setzero_ps();
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int v = 0; v < n8; v++) {
        const __m256 xv = _mm256_loadu_ps(x + 8 * v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(xv, xv, _CMP_UNORD_Q));
        mx = _mm256_max_ps(_mm256_and_ps(xv, absm), mx);
    }
    const float amax = hmax8(mx);
    if (_mm256_movemask_ps(nan) || !(amax <= 3.40282347e38f)) return 0;
    const float d = amax / 127.0f;
    if (amax == 0.0f) {
        memset(q, 0, (size_t)n8 * 8);
        *dout = 0.0f;
        for (int j = 0; j < n8 / 2; j++) sum16[j] = 0;
        return 1;
    }
    if (d == 0.0f) return 0;
    const __m256 vd = _mm256_set1_ps(d), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int v = 0; v < n8; v += 4) {
        __m256i qi[4];
        for (int j = 0; j < 4; j++) {
            __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + 8 * (v + j)), vd),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm256_min_ps(_mm256_max_ps(r, lo), hi);
            qi[j] = _mm256_cvttps_epi32(r);
        }
        sum16[v / 2] = hsum8i(_mm256_add_epi32(qi[0], qi[1]));
        sum16[v / 2 + 1] = hsum8i(_mm256_add_epi32(qi[2], qi[3]));
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
        _mm256_storeu_si256((__m256i *)(void *)(q + 8 * v), _mm256_permutevar8x32_epi32(p, perm));
    }
    *dout = d;
    return 1;
}

void quant_act_row_avx2(enum quant_act act, const float *x, void *dst, int64_t k) {
    if (act == QA_F32) {
        memcpy(dst, x, (size_t)k * 4);
    } else if (act == QA_Q8_32) {
        block_q8a *b = dst;
        for (int64_t i = 0; i < k / QK32; i++) {
            int s16[2];
            float d;
            if (!qblock(x + i * QK32, 4, b[i].q, &d, s16)) {
                quant_act_row(act, x + i * QK32, &b[i], QK32);
                continue;
            }
            b[i].d = d;
            b[i].s = s16[0] + s16[1];
        }
    } else {
        block_q8k *b = dst;
        for (int64_t i = 0; i < k / QK_K; i++) {
            int s16[16];
            float d;
            if (!qblock(x + i * QK_K, 32, b[i].q, &d, s16)) {
                quant_act_row(act, x + i * QK_K, &b[i], QK_K);
                continue;
            }
            b[i].d = d;
            for (int j = 0; j < 16; j++) b[i].bsums[j] = (int16_t)s16[j];
        }
    }
}
