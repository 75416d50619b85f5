/* repack_avx2.c — AVX2 gemm kernels on repacked Q4_K / Q5_K / Q6_K and 32-weight-block matrices (layouts in repack.c),
 * bitwise equal to the scalar reference in quant.c.
 *
 * A 64-byte weight vector of the layout is two ymm halves: rows 0..7 (bytes 0..31) and rows
 * 8..15 (bytes 32..63); each half is computed on its own, lane = row. Without VNNI the 4-byte
 * products go through vpmaddubsw (u8 quant x s8 activation -> int16 pair sums; never
 * saturating: |pair| <= 2*15*127 = 3810 for Q4_K, 2*63*127 = 16002 for Q6_K) and are summed
 * in int16 lanes with vpaddw while they provably fit, then vpmaddwd multiplies by the
 * sub-block scale held as an int16 (sc, sc) pair per row, giving sc * (sum of the row's
 * products) in int32:
 *   Q4_K: 8 weight vectors per sub-block: each int16 lane sums 16 products, |.| <= 16*15*127 =
 *         30480 < 2^15; I = sum_j sc_j*s_j; M = sum_j m_j*(bsum_2j + bsum_2j+1) by vpmaddwd
 *         on int16 pairs; acc = fma(d*da, (float)I, acc); acc = fma(-(dmin*da), (float)M, acc).
 *   Q6_K: 2 weight vectors at a time (4 products per int16 lane, <= 4*63*127 = 32004 < 2^15),
 *         u = q + 32 unsigned; I = sum_j sc_j*s_j - 32 * sum_j sc_j*bsum_j (vpmaddwd on int16
 *         (sc_2p, sc_2p+1) x (bsum_2p, bsum_2p+1) pairs); acc = fma(d*da, (float)I, acc).
 * With AVX-VNNI (the build in repack_avx2vnni.c, RP_AVXVNNI) each sub-block's products are
 * summed in int32 lanes by vpdpbusd and scaled by vpmulld instead (sb_dot / sb_mul_add below).
 * int32 bounds as in repack_avx512.c. Blocks ascend: every lane runs the reference's chain.
 * One token (Q4_K, and Q6_K in the non-VNNI build) has its own path, q4k_group1 / q6k_group1: a whole
 * 16-row group per call, both halves at once; in the non-VNNI build Q4_K chunks of 2-6 tokens run
 * both halves at once too (q4k_tokens16), so each activation broadcast serves 16 rows. The
 * one-token calls request their weights ahead (one_requests) unless the stream form is plain;
 * the multi-token ones always do (mt_requests).
 * Sums that GCC may reassociate are pinned in order (pin): reassociated, it kept a
 * sub-block's eight products live and spilled them (bench/cpu-speed-log.md, twenty-third session). */
#include <immintrin.h>
#include <string.h>

#include "cpu/prefetch.h"
#include "cpu/repack.h"

/* The AVX2 kernels' weight requests: one per line, into L2 (RP2_HINT), RP2_PF_DIST ahead at one
 * token (with the re-requests of cpu_prefetch_again) and RP2_MT_DIST ahead at more; not the
 * two-request form of cpu/prefetch.h, which read 0.77-0.94x at one token and 0.93-1.24x at six
 * (Intel host, fourteenth session). Until the twenty-ninth session the requests went into L1
 * (T0); on the Zen 4 host at the AVX2 level, from memory on two threads, into L2 read 1.8x at one
 * token, 2.2x at two and 1.7-1.8x at six, 1.5-1.7x on expert- and q-shaped matrices, and the
 * whole solo step 1.25x the plain form's (which had read 1.21x the L1 requests'): an L1 request
 * holds one of the core's few L1 miss buffers for a full memory latency. At one token 8 KiB read
 * 0.76-1.24x 4 KiB; at two to six tokens 8 KiB 1.00-1.13x 4 KiB (bench/cpu-speed-log.md). Overridable
 * at build time for bench/ab_kernel.sh. */
#ifndef RP2_PF_DIST
#define RP2_PF_DIST 4096 /* one token: bytes ahead */
#endif
#ifndef RP2_MT_DIST
#define RP2_MT_DIST 8192 /* more tokens: bytes ahead */
#endif
#ifndef RP2_HINT
#define RP2_HINT _MM_HINT_T1
#endif
#ifdef RP_AVXVNNI
#define RP_NAME(f) f##vnni
#else
#define RP_NAME(f) f
#endif
#define AI static inline __attribute__((always_inline))
#define TCH 4   /* tokens per chunk: Q6_K (above six tokens) and the 32-weight blocks */
#define TCH45 6 /* tokens per chunk: Q4_K and Q5_K (their sums fit 16 registers at 6; Q6_K's spill) */
#define TSUP 64 /* tokens whose fp32 accumulators live on the stack at once */

/* The length of chunk c when n_tok tokens are cut into the fewest chunks of at most tch, as even
 * as can be (6 = 3 + 3 at tch 4, not 4 + 2: a two-token chunk reads the weights for half as many
 * tokens). */
static inline int chunk_len(int n_tok, int tch, int c) {
    const int nc = (n_tok + tch - 1) / tch;
    return n_tok / nc + (c < n_tok % nc);
}

#define GEMM_ARGS                                                                          \
    const void *w, size_t group_bytes, int r0, int r1, int k, const void *act,             \
        size_t act_bytes, int n_tok, float *out, size_t out_stride

#define LD(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))

AI __m256i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
AI const uint8_t *launder(const uint8_t *p) {
    __asm__("" : "+r"(p));
    return p;
}
/* The same for an activation block: each half of q6k_one reads the activations through its own copy,
 * so the compiler does not keep the broadcasts of one half for the other (it spilled them). */
AI const block_q8k *launder_y(const block_q8k *p) {
    __asm__ volatile("" : "+r"(p)); /* volatile: two copies of one pointer are not merged */
    return p;
}
AI const uint8_t *launder_v(const uint8_t *p) {
    __asm__ volatile("" : "+r"(p));
    return p;
}
/* v as a register value the compiler cannot re-load (repack_avx512.c's in_reg). */
AI __m256i in_reg(__m256i v) {
    __asm__ volatile("" : "+x"(v));
    return v;
}
AI void pin(__m256i *v) { __asm__ volatile("" : "+x"(*v)); }

AI __m256 chain(__m256 acc, __m256 d, float da, __m256i I) {
    return _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(I), acc);
}
/* acc = fma(-(dm*da), (float)M, acc) as fnmadd: the same exact product and one rounding, the same bits. */
AI __m256 chain_neg(__m256 acc, __m256 dm, float da, __m256i M) {
    return _mm256_fnmadd_ps(_mm256_mul_ps(dm, _mm256_set1_ps(da)), _mm256_cvtepi32_ps(M), acc);
}
AI __m256 ld_f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }

/* Per dword: bytes (n, n) -> int16 pair (b_n, b_n), zero-extended. */
AI __m256i byte_to_wpair(__m256i v, int n) {
    const __m256i idx = _mm256_setr_epi32((int)0x80008000 + n * 0x10001, (int)0x80048004 + n * 0x10001,
                                          (int)0x80088008 + n * 0x10001, (int)0x800c800c + n * 0x10001,
                                          (int)0x80008000 + n * 0x10001, (int)0x80048004 + n * 0x10001,
                                          (int)0x80088008 + n * 0x10001, (int)0x800c800c + n * 0x10001);
    return _mm256_shuffle_epi8(v, idx);
}
/* Per dword: bytes (2h, 2h+1) -> int16 pair, zero-extended. */
AI __m256i bytes_to_words(__m256i v, int h) {
    const int o = 0x00020002 * h;
    const __m256i idx = _mm256_setr_epi32((int)0x80018000 + o, (int)0x80058004 + o, (int)0x80098008 + o, (int)0x800d800c + o,
                                          (int)0x80018000 + o, (int)0x80058004 + o, (int)0x80098008 + o, (int)0x800d800c + o);
    return _mm256_shuffle_epi8(v, idx);
}

/* A sub-block's sum of products and its scaling, in the build's flavour. Plain AVX2: int16
 * pair sums (vpmaddubsw) added in int16 lanes, then I + (sc, sc) x (pair) by vpmaddwd. With
 * RP_AVXVNNI (repack_avx2vnni.c, hosts with AVX-VNNI): int32 lane sums of four products
 * (vpdpbusd), then I + sc * s by vpmulld. Both are the same exact integers. */
#ifdef RP_AVXVNNI
AI __m256i sb_dot(__m256i s, __m256i W, __m256i a) { return _mm256_dpbusd_avx_epi32(s, W, a); }
/* Per dword: byte n -> int32, zero-extended. */
AI __m256i sb_scale(__m256i v, int n) {
    const __m256i idx = _mm256_setr_epi32((int)0x80808000 + n, (int)0x80808004 + n, (int)0x80808008 + n,
                                          (int)0x8080800c + n, (int)0x80808000 + n, (int)0x80808004 + n,
                                          (int)0x80808008 + n, (int)0x8080800c + n);
    return _mm256_shuffle_epi8(v, idx);
}
AI __m256i sb_mul_add(__m256i I, __m256i s, __m256i sc) { return _mm256_add_epi32(I, _mm256_mullo_epi32(s, sc)); }
#else
AI __m256i sb_dot(__m256i s, __m256i W, __m256i a) { return _mm256_add_epi16(s, _mm256_maddubs_epi16(W, a)); }
AI __m256i sb_scale(__m256i v, int n) { return byte_to_wpair(v, n); }
AI __m256i sb_mul_add(__m256i I, __m256i s, __m256i sc) { return _mm256_add_epi32(I, _mm256_madd_epi16(s, sc)); }
#endif

/* ---- Q4_K (half h = rows 8h .. 8h+7) ---------------------------------------------------------- */

AI __m256i q4k_slo(const uint8_t *B) { return _mm256_and_si256(LD(B + RP_Q4K_SC), _mm256_set1_epi8(0x3f)); }
AI __m256i q4k_shi(const uint8_t *B) {
    return _mm256_or_si256(_mm256_and_si256(LD(B + RP_Q4K_SC + 128), _mm256_set1_epi8(0x0f)),
                           _mm256_and_si256(_mm256_srli_epi32(LD(B + RP_Q4K_SC), 2), _mm256_set1_epi8(0x30)));
}
AI __m256i q4k_mlo(const uint8_t *B) { return _mm256_and_si256(LD(B + RP_Q4K_SC + 64), _mm256_set1_epi8(0x3f)); }
AI __m256i q4k_mhi(const uint8_t *B) {
    return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(LD(B + RP_Q4K_SC + 128), 4), _mm256_set1_epi8(0x0f)),
                           _mm256_and_si256(_mm256_srli_epi32(LD(B + RP_Q4K_SC + 64), 2), _mm256_set1_epi8(0x30)));
}

/* The min term M = sum_j m_j * (bsum_2j + bsum_2j+1) of one token for the half's 8 rows: mp[p]
 * lane r = int16 (m_2p, m_2p+1) of row r (bytes_to_words of mlo / mhi), y the token's block.
 * The pair sums bp_j (int32) are packed to int16 (exact: |bp| <= 4064): in 128-bit lane L,
 * dwords 0,1 = (bp_4L, bp_4L+1), (bp_4L+2, bp_4L+3). */
AI __m256i q4k_min_sum(const __m256i mp[4], const block_q8k *y) {
    const __m256i bp32 = _mm256_madd_epi16(LD(y->bsums), _mm256_set1_epi16(1));
    const __m256i bp = _mm256_packs_epi32(bp32, bp32);
    __m256i M = _mm256_madd_epi16(mp[0], _mm256_permutevar8x32_epi32(bp, _mm256_set1_epi32(0)));
    M = _mm256_add_epi32(M, _mm256_madd_epi16(mp[1], _mm256_permutevar8x32_epi32(bp, _mm256_set1_epi32(1))));
    M = _mm256_add_epi32(M, _mm256_madd_epi16(mp[2], _mm256_permutevar8x32_epi32(bp, _mm256_set1_epi32(4))));
    return _mm256_add_epi32(M, _mm256_madd_epi16(mp[3], _mm256_permutevar8x32_epi32(bp, _mm256_set1_epi32(5))));
}
/* The one-token kernel's min-term operand of one activation block (repack_avx512.c's q4k_hl): the pair
 * sums ps_j (|ps_j| <= 4064) split exactly as 128 h_j + l_j, h_j = ps_j >> 7 in -32..31, l_j = ps_j & 127;
 * bytes 0..7 = h_0..h_7, 8..15 = l_0..l_7 (int8): RP_Q4K_HL_BYTES (repack.h). */
AI void q4k_hl(const block_q8k *y, int8_t *hl) {
    const __m256i bp32 = _mm256_madd_epi16(LD(y->bsums), _mm256_set1_epi16(1));
    const __m128i ps = _mm_packs_epi32(_mm256_castsi256_si128(bp32), _mm256_extracti128_si256(bp32, 1));
    _mm_storeu_si128((__m128i *)(void *)hl,
                     _mm_packs_epi16(_mm_srai_epi16(ps, 7), _mm_and_si128(ps, _mm_set1_epi16(127))));
}
/* M of one token for the half's 8 rows from its q4k_hl operand, on the mins' bytes (lane r of mlo / mhi:
 * m_0..3 / m_4..7, unsigned <= 63) as they are decoded: 128 * sum_j m_j h_j + sum_j m_j l_j. AVX-VNNI: four
 * vpdpbusd. Plain AVX2: vpmaddubsw pairs (|m h + m' h'| <= 2*63*32, m l + m' l' <= 2*63*127 = 16002), two
 * added in int16 (<= 32004 < 2^15), then vpmaddwd by 128 and by 1. */
AI __m256i q4k_min_sum_hl(__m256i mlo, __m256i mhi, const int8_t *hl) {
#ifdef RP_AVXVNNI
    const __m256i Mh = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), mlo, bcast4(hl)), mhi,
                                               bcast4(hl + 4));
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_slli_epi32(Mh, 7), mlo, bcast4(hl + 8)), mhi,
                                   bcast4(hl + 12));
#else
    const __m256i h = _mm256_add_epi16(_mm256_maddubs_epi16(mlo, bcast4(hl)), _mm256_maddubs_epi16(mhi, bcast4(hl + 4)));
    const __m256i l = _mm256_add_epi16(_mm256_maddubs_epi16(mlo, bcast4(hl + 8)), _mm256_maddubs_epi16(mhi, bcast4(hl + 12)));
    return _mm256_add_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(128)), _mm256_madd_epi16(l, _mm256_set1_epi16(1)));
#endif
}

/* mp of q4k_min_sum for the half whose scale vectors are at B. */
AI void q4k_min_pairs(const uint8_t *B, __m256i mp[4]) {
    const __m256i mlo = q4k_mlo(B), mhi = q4k_mhi(B);
    mp[0] = bytes_to_words(mlo, 0), mp[1] = bytes_to_words(mlo, 1);
    mp[2] = bytes_to_words(mhi, 0), mp[3] = bytes_to_words(mhi, 1);
}

/* Bit j of each byte of H at bit 4 (0x10), the rest zero. */
AI __m256i q5k_bit(__m256i H, const int j) {
    const __m256i h = j <= 4 ? _mm256_slli_epi16(H, 4 - j) : _mm256_srli_epi16(H, j - 4);
    return _mm256_and_si256(h, _mm256_set1_epi8(0x10)); /* 16-bit shifts: bit 4 of each byte is that byte's bit j */
}
/* B: the block + 32h (weight and scale vectors of the half), D: the block's d + 16h; q5: a Q5_K
 * block, whose quants get their 5th bit (bit j of the H vector's byte for sub-block j) at bit 4:
 * u = q in 0..31, so in the non-VNNI build an int16 lane holds only 8 products (<= 8*31*127 = 31496
 * < 2^15) and each sub-block is summed in two halves of 4 vectors, each scaled on its own. */
AI void q45k_tokens(const int q5, const int T, const uint8_t *B, const uint8_t *D, const block_q8k *const *y,
                    float *acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    const int nv = q5 ? 4 : 8; /* vectors per partial sum */
    __m256i I[TCH45], scv[8];
    {
        const __m256i lo = q4k_slo(B), hi = q4k_shi(B);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) scv[j] = sb_scale(j < 4 ? lo : hi, j & 3);
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) I[t] = _mm256_setzero_si256();
    /* sub-blocks 2p (low nibbles) and 2p+1 (high) of weight vectors 8p .. 8p+7; the loop over p is
     * kept rolled: unrolled, the kernel's straight-line code outgrew Zen 3's op cache */
    _Pragma("GCC unroll 1") for (int p = 0; p < 4; p++) {
        const uint8_t *Bp = launder(B) + RP_Q45K_QS(q5) + 512 * p;
        const __m128i hsh = _mm_cvtsi32_si128(2 * p);
        _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {
            const int j = 2 * p + e;
            _Pragma("GCC unroll 2") for (int i0 = 0; i0 < 8; i0 += nv) {
                __m256i s[TCH45];
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
                _Pragma("GCC unroll 8") for (int i = i0; i < i0 + nv; i++) {
                    const __m256i Q = LD(Bp + 64 * i);
                    __m256i W = e ? _mm256_and_si256(_mm256_srli_epi16(Q, 4), m0f) : _mm256_and_si256(Q, m0f);
                    if (q5) /* bit j = 2p + e of each byte of the H vector, to bit 4 (16-bit shifts) */
                        W = _mm256_or_si256(W, _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(LD(B + RP_Q5K_QH + 64 * i), hsh), 4 - e),
                                                                _mm256_set1_epi8(0x10)));
                    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                        s[t] = sb_dot(s[t], W, bcast4(y[t]->q + 32 * j + 4 * i));
                        pin(&s[t]); /* the sum in this order: reassociated, GCC kept all 8 products live and spilled */
                    }
                }
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                    I[t] = sb_mul_add(I[t], s[t], scv[j]);
                    pin(&I[t]);
                }
            }
        }
    }
    __m256i mp[4];
    q4k_min_pairs(B, mp);
    const __m256 d = ld_f16x8(D), dmin = ld_f16x8(D + (RP_Q4K_DMIN - RP_Q4K_D));
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        const __m256i M = q4k_min_sum(mp, y[t]);
        __m256 a = _mm256_load_ps(acc + 16 * t);
        a = chain(a, d, y[t]->d, I[t]);
        a = chain_neg(a, dmin, y[t]->d, M);
        _mm256_store_ps(acc + 16 * t, a);
    }
}

/* One token against one whole Q4_K block B (both halves), accumulators a[h] updated: the same
 * integer sums and fp32 chain per lane as q45k_tokens(0, 1, ...) on each half, in another order.
 * Each 32-byte weight vector is loaded once for both of its nibbles (sub-blocks 2p and 2p+1),
 * and each activation broadcast serves both halves; the four sums of a pair run as
 * independent chains, pinned in order (reassociated, GCC keeps the products live and spills). */
AI void q4k_one(const uint8_t *B, const block_q8k *y, const int8_t *hl, __m256 a[2]) {
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    __m256i I[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
        __m256i se[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, so[2] = {se[0], se[0]};
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            const __m256i ae = bcast4(y->q + 64 * p + 4 * i), ao = bcast4(y->q + 64 * p + 32 + 4 * i);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                /* loaded once for both nibbles: as two loads (one folded into the AND) the kernel read
                 * 0.91x from memory in the near-far form (three requests a line share the load ports) */
                const __m256i Q = in_reg(LD(B + RP_Q4K_QS + 64 * (8 * p + i) + 32 * h));
                se[h] = sb_dot(se[h], _mm256_and_si256(Q, m0f), ae);
                so[h] = sb_dot(so[h], _mm256_and_si256(_mm256_srli_epi16(Q, 4), m0f), ao);
                pin(&se[h]);
                pin(&so[h]);
            }
        }
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            const uint8_t *Bh = launder(B) + 32 * h; /* scales decoded here, not hoisted and spilled */
            const __m256i sc = p < 2 ? q4k_slo(Bh) : q4k_shi(Bh);
            I[h] = sb_mul_add(I[h], se[h], sb_scale(sc, (2 * p) & 3));
            I[h] = sb_mul_add(I[h], so[h], sb_scale(sc, (2 * p + 1) & 3));
            pin(&I[h]);
        }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i M;
        if (hl) M = q4k_min_sum_hl(q4k_mlo(B + 32 * h), q4k_mhi(B + 32 * h), hl);
        else {
            __m256i mp[4];
            q4k_min_pairs(B + 32 * h, mp);
            M = q4k_min_sum(mp, y);
        }
        const __m256 d = ld_f16x8(B + RP_Q4K_D + 16 * h), dmin = ld_f16x8(B + RP_Q4K_DMIN + 16 * h);
        a[h] = chain_neg(chain(a[h], d, y->d, I[h]), dmin, y->d, M);
    }
}

/* The weight requests of a one-token kernel for the `bytes` at p (one block): RP2_PF_DIST ahead
 * into L2, continuing into nx past `end`, and again CPU_PF_AGAIN1 / CPU_PF_AGAIN2 ahead (without
 * these, into L2, Q4_K read 1.13-1.22x and Q6_K 0.86-0.88x on the Zen 4 host: kept). The plain
 * stream form (CPU_STREAM_PLAIN) makes none: the hardware prefetchers alone. */
AI void one_requests(const uint8_t *p, size_t bytes, const uint8_t *end, const cpu_next *nx) {
    cpu_prefetch_tier(p, bytes, end, nx, RP2_PF_DIST, RP2_HINT);
    cpu_prefetch_again(p, bytes, end, RP2_HINT);
}

/* The weight requests of a multi-token call for the `bytes` at p (one block, or a Q6_K group's
 * header): RP2_MT_DIST ahead into L2, continuing into nx past `end`. */
AI void mt_requests(const uint8_t *p, size_t bytes, const uint8_t *end, const cpu_next *nx) {
    cpu_prefetch_tier(p, bytes, end, nx, RP2_MT_DIST, RP2_HINT);
}

/* One token against one 16-row Q4_K group (every block, both halves' accumulators in
 * registers), its 16 sums to acc; rq: with the weight requests (one_requests). hl: the token's q4k_hl
 * operands, RP_Q4K_HL_BYTES a block (NULL: the min term from y's bsums in each block). */
static __attribute__((noinline)) void q4k_group1(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl,
                                                 float *acc, const uint8_t *end, const cpu_next *nx, const bool rq) {
    __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const uint8_t *B = G + (size_t)b * RP_Q4K_BLOCK;
        if (rq) one_requests(B, RP_Q4K_BLOCK, end, nx);
        q4k_one(B, y + b, hl ? hl + RP_Q4K_HL_BYTES * b : NULL, a);
    }
    _mm256_store_ps(acc, a[0]);
    _mm256_store_ps(acc + 8, a[1]);
}

/* ---- Q6_K (half h) ------------------------------------------------------------------------------- */

AI __m256i q6k_w(const uint8_t *B, int j, int i) {
    const int e = 4 * j + i, h = e >> 5, s = (e >> 3) & 3, n = e & 7;
    const __m256i L = LD(B + rp_q6k_l(16 * h + 8 * (s & 1) + n));
    const __m256i H = LD(B + rp_q6k_h(8 * h + n));
    const __m256i lo = s < 2 ? _mm256_and_si256(L, _mm256_set1_epi8(0x0f))
                             : _mm256_and_si256(_mm256_srli_epi16(L, 4), _mm256_set1_epi8(0x0f));
    const __m256i hs = s == 0 ? _mm256_slli_epi16(H, 4) : s == 1 ? _mm256_slli_epi16(H, 2)
                     : s == 2 ? H : _mm256_srli_epi16(H, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}
/* The vpshufb index that makes (sc_j, sc_j) in each dword of a scale pair (q6k_scpair): per dword
 * m, bytes (4m, 4m+1) twice for j even, (4m+2, 4m+3) twice for j odd. */
AI __m256i q6k_dup(const int odd) {
    const __m256i d0 = _mm256_setr_epi32(0x01000100, 0x05040504, 0x09080908, 0x0d0c0d0c, 0x01000100, 0x05040504,
                                         0x09080908, 0x0d0c0d0c);
    return odd ? _mm256_add_epi8(d0, _mm256_set1_epi8(2)) : d0;
}
/* A scale pair of the half's 8 rows from its 16 bytes at S: dword lane = int16 (sc_2p, sc_2p+1). */
AI __m256i q6k_scpair(const uint8_t *S) { return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)S)); }

/* B: the block + 32h (weight vectors), S: the block + 16h (scale pairs at rp_q6k_s), D: its d + 16h. */
AI void q6k_tokens(const int T, const uint8_t *B, const uint8_t *S, const uint8_t *D, const block_q8k *const *y,
                   float *acc) {
    __m256i I[TCH45];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) I[t] = _mm256_setzero_si256();
#ifndef RP_AVXVNNI
    const __m256i dup0 = q6k_dup(0), dup1 = q6k_dup(1);
#endif
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
        const uint8_t *Bj = launder(B);
        const __m256i pr = q6k_scpair(launder(S) + rp_q6k_s(j >> 1));
#ifdef RP_AVXVNNI
        /* sc_j as int32: the high or the low int16 of each dword, sign-extended */
        const __m256i sc = (j & 1) ? _mm256_srai_epi32(pr, 16) : _mm256_srai_epi32(_mm256_slli_epi32(pr, 16), 16);
        __m256i s[TCH45];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const __m256i W = q6k_w(Bj, j, i);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = sb_dot(s[t], W, bcast4(y[t]->q + 16 * j + 4 * i));
        }
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) I[t] = sb_mul_add(I[t], s[t], sc);
#else
        const __m256i sc = _mm256_shuffle_epi8(pr, (j & 1) ? dup1 : dup0); /* (sc_j, sc_j) */
        _Pragma("GCC unroll 2") for (int i = 0; i < 4; i += 2) {
            const __m256i W0 = q6k_w(Bj, j, i), W1 = q6k_w(Bj, j, i + 1);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(W0, bcast4(y[t]->q + 16 * j + 4 * i)),
                                                   _mm256_maddubs_epi16(W1, bcast4(y[t]->q + 16 * j + 4 * i + 4)));
                I[t] = sb_mul_add(I[t], s, sc);
            }
        }
#endif
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) pin(&I[t]);
    }
    const __m256 d = ld_f16x8(D);
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        __m256i Bs = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
            Bs = _mm256_add_epi32(Bs, _mm256_madd_epi16(q6k_scpair(S + rp_q6k_s(p)), bcast4(y[t]->bsums + 2 * p)));
        const __m256i It = _mm256_sub_epi32(I[t], _mm256_slli_epi32(Bs, 5));
        __m256 a = _mm256_load_ps(acc + 16 * t);
        a = chain(a, d, y[t]->d, It);
        _mm256_store_ps(acc + 16 * t, a);
    }
}

#ifndef RP_AVXVNNI
/* One token against one whole Q6_K block B (both halves; the 16 fp16 d at D), accumulators a[h]
 * updated: the same integer sums and fp32 chain per lane as q6k_tokens(1, ...) on each half, in
 * another order (q6k_one of repack_avx512.c, on ymm halves). The four weight vectors that share
 * their loads (e = 32hh + 8sq + n, sq = 0..3: nibble vectors L[16hh + n], L[16hh + 8 + n], 2-bit
 * vector H[8hh + n]) are made together from three loads; each sub-block's two int16 sums of two
 * vectors (<= 2 * 2*63*127 = 32004 < 2^15, as in q6k_tokens) are scaled by vpmaddwd as soon as
 * they are complete. The generic path at T = 1 made each vector from two loads, called a kernel
 * per block half, and spilled (bench/cpu-speed-log.md, twenty-eighth session). */
AI void q6k_one(const uint8_t *B, const uint8_t *D, const block_q8k *y, __m256 a[2]) {
    const __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    const __m256i dup[2] = {q6k_dup(0), q6k_dup(1)};
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const uint8_t *Bh = launder(B) + 32 * h, *Sh = launder(B) + 16 * h;
        const block_q8k *yh = launder_y(y);
        __m256i I = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int hh = 0; hh < 2; hh++) {
            _Pragma("GCC unroll 4") for (int np = 0; np < 8; np += 2) {
                __m256i ps[4]; /* sub-block 8hh + 2sq + (np >> 2): the int16 sums of vectors np & 3, +1 */
                _Pragma("GCC unroll 2") for (int n = np; n < np + 2; n++) {
                    const __m256i L0 = LD(Bh + rp_q6k_l(16 * hh + n)), L1 = LD(Bh + rp_q6k_l(16 * hh + 8 + n));
                    const __m256i H = LD(Bh + rp_q6k_h(8 * hh + n));
                    const __m256i u[4] = {
                        _mm256_or_si256(_mm256_and_si256(L0, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)),
                        _mm256_or_si256(_mm256_and_si256(L1, m0f), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m0f), _mm256_and_si256(H, m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m0f),
                                        _mm256_and_si256(_mm256_srli_epi16(H, 2), m30)),
                    };
                    _Pragma("GCC unroll 4") for (int sq = 0; sq < 4; sq++) {
                        const int j = 8 * hh + 2 * sq + (n >> 2);
                        const __m256i pr = _mm256_maddubs_epi16(u[sq], bcast4(yh->q + 16 * j + 4 * (n & 3)));
                        ps[sq] = n == np ? pr : _mm256_add_epi16(ps[sq], pr);
                        pin(&ps[sq]);
                    }
                }
                const uint8_t *Sn = launder_v(Sh); /* the scale pairs loaded again for each use, not kept */
                _Pragma("GCC unroll 4") for (int sq = 0; sq < 4; sq++) {
                    const __m256i sc = _mm256_shuffle_epi8(q6k_scpair(Sn + rp_q6k_s(4 * hh + sq)), dup[np >> 2]);
                    I = _mm256_add_epi32(I, _mm256_madd_epi16(ps[sq], sc));
                    pin(&I);
                }
            }
        }
        __m256i Bs = _mm256_setzero_si256();
        _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
            Bs = _mm256_add_epi32(Bs, _mm256_madd_epi16(q6k_scpair(Sh + rp_q6k_s(p)), bcast4(yh->bsums + 2 * p)));
        a[h] = chain(a[h], ld_f16x8(D + 16 * h), yh->d, _mm256_sub_epi32(I, _mm256_slli_epi32(Bs, 5)));
    }
}

/* One token against one 16-row Q6_K group (its header of fp16 d, then every block; both halves'
 * accumulators in registers), its 16 sums to acc; rq as in q4k_group1. */
static __attribute__((noinline)) void q6k_group1(const uint8_t *G, int nb, const block_q8k *y, float *acc,
                                                 const uint8_t *end, const cpu_next *nx, const bool rq) {
    const size_t hdr = rp_q6k_header(nb);
    if (rq) cpu_prefetch_tier(G, hdr, end, nx, RP2_PF_DIST, RP2_HINT);
    __m256 a[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        const uint8_t *B = G + hdr + (size_t)b * RP_Q6K_BLOCK;
        if (rq) one_requests(B, RP_Q6K_BLOCK, end, nx);
        q6k_one(B, G + 32 * b, y + b, a);
    }
    _mm256_store_ps(acc, a[0]);
    _mm256_store_ps(acc + 8, a[1]);
}
#define RP_ONE6 1 /* Q6_K has a one-token path */
#else
#define RP_ONE6 0 /* the AVX-VNNI build's T = 1 chunk kernel sums in int32: Q6_K keeps it */
#endif

#ifndef RP_AVXVNNI
#define TCH16 6 /* tokens per chunk of q4k_tokens16 (4 or 5 read 0.87-0.96x at 5-32 tokens) */
/* T tokens (y[t]: their activation block) against one whole Q4_K block B, both halves at once:
 * each activation broadcast serves the 16 rows (the half-block kernel, q45k_tokens, makes every
 * broadcast twice, and llvm-mca's Zen 3 model puts each on a vector pipe, as many as the
 * vpmaddubsw). The same int16 sums (8 vectors each) and the same I, M and fp32 chain per lane as
 * q45k_tokens(0, T, ...) on each half; the I sums live in memory (L1) at T = 6. In cache, one
 * thread: 1.05-1.12x the half-block kernel at 2-32 tokens (bench/cpu-speed-log.md, twenty-eighth
 * session). acc: T x 16 floats (half h at 8h). */
AI void q4k_tokens16(const int T, const uint8_t *B, const block_q8k *const *y, float *acc) {
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    __m256i scv[2][8]; /* (sc_j, sc_j) of each half: made once, read as memory operands */
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        const __m256i lo = q4k_slo(B + 32 * h), hi = q4k_shi(B + 32 * h);
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) scv[h][j] = sb_scale(j < 4 ? lo : hi, j & 3);
    }
    __m256i I[TCH16][2];
    _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) I[t][0] = I[t][1] = _mm256_setzero_si256();
    _Pragma("GCC unroll 1") for (int p = 0; p < 4; p++) {
        const uint8_t *Bp = launder(B) + RP_Q4K_QS + 512 * p;
        _Pragma("GCC unroll 2") for (int e = 0; e < 2; e++) {
            const int j = 2 * p + e;
            __m256i s[TCH16][2];
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) s[t][0] = s[t][1] = _mm256_setzero_si256();
            _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
                __m256i W[2];
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    const __m256i Q = LD(Bp + 64 * i + 32 * h);
                    W[h] = e ? _mm256_and_si256(_mm256_srli_epi16(Q, 4), m0f) : _mm256_and_si256(Q, m0f);
                }
                _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
                    const __m256i a = bcast4(y[t]->q + 32 * j + 4 * i);
                    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                        s[t][h] = _mm256_add_epi16(s[t][h], _mm256_maddubs_epi16(W[h], a));
                        pin(&s[t][h]);
                    }
                }
            }
            _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                I[t][h] = sb_mul_add(I[t][h], s[t][h], scv[h][j]);
                pin(&I[t][h]);
            }
        }
    }
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m256i mp[4];
        q4k_min_pairs(B + 32 * h, mp);
        const __m256 d = ld_f16x8(B + RP_Q4K_D + 16 * h), dmin = ld_f16x8(B + RP_Q4K_DMIN + 16 * h);
        _Pragma("GCC unroll 6") for (int t = 0; t < T; t++) {
            const __m256i M = q4k_min_sum(mp, y[t]);
            __m256 a = _mm256_load_ps(acc + 16 * t + 8 * h);
            a = chain(a, d, y[t]->d, I[t][h]);
            a = chain_neg(a, dmin, y[t]->d, M);
            _mm256_store_ps(acc + 16 * t + 8 * h, a);
        }
    }
}
typedef void (*tok16_fn)(const uint8_t *B, const block_q8k *const *y, float *acc);
#define DEF_T16(T)                                                                                              \
    static __attribute__((noinline)) void q4k_u##T(const uint8_t *B, const block_q8k *const *y, float *acc) {   \
        q4k_tokens16(T, B, y, acc);                                                                             \
    }
DEF_T16(2)
DEF_T16(3)
DEF_T16(4)
DEF_T16(5)
DEF_T16(6)
static const tok16_fn tok16_table[TCH16 + 1] = {NULL, NULL, q4k_u2, q4k_u3, q4k_u4, q4k_u5, q4k_u6};
#define RP_TOK16 1 /* Q4_K chunks of 2..TCH16 tokens run q4k_tokens16 */
#else
#define RP_TOK16 0
#endif

/* ---- the gemm ------------------------------------------------------------------------------------ */

typedef void (*tok_fn)(const uint8_t *B, const uint8_t *S, const uint8_t *D, const block_q8k *const *y, float *acc);
#define DEF_T45(T)                                                                                              \
    static __attribute__((noinline)) void q4k_t##T(const uint8_t *B, const uint8_t *S, const uint8_t *D,        \
                                                   const block_q8k *const *y, float *acc) {                     \
        (void)S;                                                                                                \
        q45k_tokens(0, T, B, D, y, acc);                                                                        \
    }                                                                                                           \
    static __attribute__((noinline)) void q5k_t##T(const uint8_t *B, const uint8_t *S, const uint8_t *D,        \
                                                   const block_q8k *const *y, float *acc) {                     \
        (void)S;                                                                                                \
        q45k_tokens(1, T, B, D, y, acc);                                                                        \
    }
#define DEF_T6(T)                                                                                               \
    static __attribute__((noinline)) void q6k_t##T(const uint8_t *B, const uint8_t *S, const uint8_t *D,        \
                                                   const block_q8k *const *y, float *acc) {                     \
        q6k_tokens(T, B, S, D, y, acc);                                                                         \
    }
DEF_T45(1)
DEF_T45(2)
DEF_T45(3)
DEF_T45(4)
DEF_T45(5)
DEF_T45(6)
DEF_T6(1)
DEF_T6(2)
DEF_T6(3)
DEF_T6(4)
DEF_T6(5)
DEF_T6(6)
/* [0: Q4_K, 1: Q6_K, 2: Q5_K][T] */
static const tok_fn tok_table[3][TCH45 + 1] = {
    {NULL, q4k_t1, q4k_t2, q4k_t3, q4k_t4, q4k_t5, q4k_t6},
    {NULL, q6k_t1, q6k_t2, q6k_t3, q6k_t4, q6k_t5, q6k_t6},
    {NULL, q5k_t1, q5k_t2, q5k_t3, q5k_t4, q5k_t5, q5k_t6},
};

/* plain: the stream form CPU_STREAM_PLAIN, whose one-token calls make no weight requests (the
 * multi-token ones keep theirs, as at AVX-512). */
static void gemm_rp(const int type, const bool plain, GEMM_ARGS, const cpu_next *nx) {
    DT_ASSERT(r0 >= 0 && r0 % REPACK_ROWS == 0);
    const int is6 = type == QT_Q6_K, ti = type == QT_Q5_K ? 2 : is6;
    const int nb = k / QK_K;
    const size_t bb = is6 ? RP_Q6K_BLOCK : type == QT_Q5_K ? RP_Q5K_BLOCK : RP_Q4K_BLOCK;
    const size_t hdr = is6 ? rp_q6k_header(nb) : 0;
    const int g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS;
    float acc[TSUP * 16] __attribute__((aligned(64)));
    const uint8_t *end = (const uint8_t *)w + (size_t)g1 * group_bytes;
    /* Q6_K in the non-VNNI build: up to six tokens in one chunk (a batch's dense gemms: 1.04-1.12x two
     * chunks of three in cache), more in chunks of four (six-token chunks spill: 0.77x at 32 tokens);
     * the AVX-VNNI build (not measured at six) always in chunks of four */
#ifdef RP_AVXVNNI
    const int tch = is6 ? TCH : TCH45;
#else
    const int tch = is6 ? (n_tok <= TCH45 ? n_tok : TCH) : TCH45;
#endif
    const block_q8k *y[TCH45];
    if (n_tok == 1 && (type == QT_Q4_K || (is6 && RP_ONE6))) { /* one token: whole groups (q4k_group1, q6k_group1) */
        int8_t hlbuf[RP_Q4K_HL_MAX * RP_Q4K_HL_BYTES];
        const int8_t *hl = NULL;
        if (type == QT_Q4_K && nb <= RP_Q4K_HL_MAX) {
            for (int b = 0; b < nb; b++) q4k_hl((const block_q8k *)act + b, hlbuf + RP_Q4K_HL_BYTES * b);
            hl = hlbuf;
        }
        for (int g = g0; g < g1; g++) {
            const uint8_t *G = (const uint8_t *)w + (size_t)g * group_bytes;
#if RP_ONE6
            if (is6) q6k_group1(G, nb, (const block_q8k *)act, acc, end, nx, !plain);
            else
#endif
                q4k_group1(G, nb, (const block_q8k *)act, hl, acc, end, nx, !plain);
            memcpy(out + (size_t)g * REPACK_ROWS, acc, sizeof(float) * (size_t)DT_MIN(REPACK_ROWS, r1 - g * REPACK_ROWS));
        }
        return;
    }
    const bool rq = !(plain && n_tok == 1);
    for (int ts = 0; ts < n_tok; ts += TSUP) {
        const int nt = DT_MIN(TSUP, n_tok - ts);
        for (int g = g0; g < g1; g++) {
            const uint8_t *G = (const uint8_t *)w + (size_t)g * group_bytes;
            memset(acc, 0, sizeof(float) * 16 * (size_t)nt);
            if (is6 && rq) mt_requests(G, hdr, end, nx);
            for (int b = 0; b < nb; b++) {
                const uint8_t *B = G + hdr + (size_t)b * bb;
                if (rq && nt == 1) one_requests(B, bb, end, nx);
                else if (rq) mt_requests(B, bb, end, nx);
#if RP_TOK16
                if (type == QT_Q4_K && nt > 1) {
                    for (int c = 0, tc = 0, n; tc < nt; tc += n, c++) {
                        n = chunk_len(nt, TCH16, c);
                        for (int t = 0; t < n; t++)
                            y[t] = (const block_q8k *)(const void *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes) + b;
                        tok16_table[n](B, y, acc + 16 * tc);
                    }
                    continue;
                }
#endif
                for (int h = 0; h < 2; h++)
                    for (int c = 0, tc = 0, n; tc < nt; tc += n, c++) {
                        n = chunk_len(nt, tch, c);
                        for (int t = 0; t < n; t++)
                            y[t] = (const block_q8k *)(const void *)((const uint8_t *)act + (size_t)(ts + tc + t) * act_bytes) + b;
                        if (is6) tok_table[1][n](B + 32 * h, B + 16 * h, G + 32 * b + 16 * h, y, acc + 16 * tc + 8 * h);
                        else tok_table[ti][n](B + 32 * h, NULL, B + RP_Q4K_D + 16 * h, y, acc + 16 * tc + 8 * h);
                    }
            }
            const int nr = DT_MIN(REPACK_ROWS, r1 - g * REPACK_ROWS);
            for (int t = 0; t < nt; t++)
                memcpy(out + (size_t)(ts + t) * out_stride + (size_t)g * REPACK_ROWS, acc + 16 * t, sizeof(float) * (size_t)nr);
        }
    }
}

/* ---- the 32-weight blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (half x = rows 8x .. 8x+7) --------------
 * Per block, token and half, the exact I = sum (q - off')*a, then acc = fma(d*da, (float)I, acc)
 * and, for Q4_1 / Q5_1, acc = fma(m*da, (float)s, acc), blocks ascending (quant.c dot_q4_0 ..
 * dot_q8_0), as in repack_avx512.c:
 *   AVX-VNNI build: vpdpbusd on u = the nibble (with its 5th bit from H for Q5_0 / Q5_1) or
 *     q ^ 0x80 (Q8_0) into int32 lanes that start at -off*s (off = 8 / 16 / 128 / 0, s the
 *     activation block's sum).
 *   Plain build: 4-bit types by vpmaddubsw (nibble x a, |pair| <= 2*15*127 = 3810) summed in int16
 *     lanes (8 vectors: <= 30480 < 2^15); 5-bit ones (|pair| <= 2*31*127 = 7874) in two sums of 4
 *     vectors (<= 31496); widened by vpmaddwd with ones, minus off*s. Q8_0 by vpmaddubsw on
 *     (|q|, sign(a, q)) (|pair| <= 2*128*127 = 32512 < 2^15), each vector widened to int32 at once.
 * One token, and the 5-bit types, keep two partial sums per block (low / high nibbles; even / odd
 * vectors). */
AI __m256i q32_init(const int type, int32_t sa) {
#ifdef RP_AVXVNNI
    return _mm256_set1_epi32(-rp_q32_off((uint32_t)type) * sa);
#else
    (void)type, (void)sa;
    return _mm256_setzero_si256();
#endif
}
/* The weight vector vpdpbusd / vpmaddubsw takes for Q8_0's Q (as loaded). */
AI __m256i q32_prep8(__m256i Q) {
#ifdef RP_AVXVNNI
    return _mm256_xor_si256(Q, _mm256_set1_epi8((char)0x80));
#else
    return _mm256_abs_epi8(Q);
#endif
}
/* s + the products of weight vector W (a nibble vector, or q32_prep8 of Q) with activations a. */
AI __m256i q32_dot(const int q8, __m256i s, __m256i W, __m256i Q, __m256i a) {
#ifdef RP_AVXVNNI
    (void)q8, (void)Q;
    return _mm256_dpbusd_avx_epi32(s, W, a);
#else
    if (!q8) return _mm256_add_epi16(s, _mm256_maddubs_epi16(W, a));
    return _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(W, _mm256_sign_epi8(a, Q)), _mm256_set1_epi16(1)));
#endif
}
/* I of the block from its partial sums s0, s1. */
AI __m256i q32_fin(const int type, __m256i s0, __m256i s1, int32_t sa) {
#ifndef RP_AVXVNNI
    if (type != QT_Q8_0) {
        const __m256i one = _mm256_set1_epi16(1);
        const __m256i w = rp_q32_has_h((uint32_t)type)
                              ? _mm256_add_epi32(_mm256_madd_epi16(s0, one), _mm256_madd_epi16(s1, one))
                              : _mm256_madd_epi16(_mm256_add_epi16(s0, s1), one);
        return _mm256_sub_epi32(w, _mm256_set1_epi32(rp_q32_off((uint32_t)type) * sa));
    }
#endif
    (void)type, (void)sa;
    return _mm256_add_epi32(s0, s1);
}

/* T tokens against unit U (blocks 2u and, if `two`, 2u+1), both halves: y[t] token t's block 2u,
 * a[x*T + t] the accumulators of half x. */
AI void q32_unit(const int type, const int T, const uint8_t *U, const int two, const block_q8a *const *y, __m256 *a) {
    const uint32_t ty = (uint32_t)type;
    const int q8 = type == QT_Q8_0, nv = rp_q32_nv(ty), hm = rp_q32_has_m(ty), hh = rp_q32_has_h(ty);
    const int np = T == 1 || hh ? 2 : 1;
    const __m256i m0f = _mm256_set1_epi8(0x0f);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        if (h && !two) break;
        _Pragma("GCC unroll 2") for (int x = 0; x < 2; x++) {
            const uint8_t *V = launder(U) + rp_q32_v(ty, h) + 32 * x;
            const __m256i H = hh ? LD(U + rp_q32_h(ty, h) + 32 * x) : _mm256_setzero_si256();
            __m256i s[TCH][2];
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                s[t][0] = q32_init(type, y[t][h].s);
                s[t][1] = _mm256_setzero_si256();
            }
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) {
                const __m256i Q = LD(V + 64 * v);
                if (!q8) {
                    __m256i lo = _mm256_and_si256(Q, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(Q, 4), m0f);
                    if (hh) { /* weight vector v's 5th bits: bit v (low nibbles) and 4 + v (high) of H's bytes */
                        const __m256i m10 = _mm256_set1_epi8(0x10);
                        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi32(H, 4 - v), m10));
                        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi32(H, v), m10));
                    }
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                        s[t][0] = q32_dot(0, s[t][0], lo, Q, bcast4(y[t][h].q + 4 * v));
                        s[t][np - 1] = q32_dot(0, s[t][np - 1], hi, Q, bcast4(y[t][h].q + 16 + 4 * v));
                        pin(&s[t][0]);
                    }
                } else {
                    const __m256i W = q32_prep8(Q);
                    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                        s[t][v % np] = q32_dot(1, s[t][v % np], W, Q, bcast4(y[t][h].q + 4 * v));
                        pin(&s[t][v % np]);
                    }
                }
            }
            const __m256 d = ld_f16x8(U + rp_q32_d(h) + 16 * x);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++)
                a[x * T + t] = chain(a[x * T + t], d, y[t][h].d, q32_fin(type, s[t][0], s[t][1], y[t][h].s));
            if (hm) {
                const __m256 m = ld_f16x8(U + rp_q32_m(h) + 16 * x);
                _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) /* acc = fma(m*da, (float)s, acc) */
                    a[x * T + t] = _mm256_fmadd_ps(_mm256_mul_ps(m, _mm256_set1_ps(y[t][h].d)),
                                                   _mm256_set1_ps((float)y[t][h].s), a[x * T + t]);
            }
        }
    }
}

/* T tokens (y[t]: token t's activation row) against one 16-row group, every unit; acc: out,
 * [t][16]. pf: request the weights (a chunk's first pass over the group). */
AI void q32_group(const int type, const int T, const uint8_t *G, int nb, const block_q8a *const *y, float *acc,
                  const uint8_t *end, const cpu_next *nx, const bool pf) {
    const size_t ub = rp_q32_unit((uint32_t)type);
    __m256 a[2 * TCH];
    _Pragma("GCC unroll 8") for (int i = 0; i < 2 * T; i++) a[i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const uint8_t *U = G + (size_t)(b / 2) * ub;
        if (pf && T == 1) one_requests(U, ub, end, nx);
        else if (pf) mt_requests(U, ub, end, nx);
        const block_q8a *yb[TCH];
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) yb[t] = y[t] + b;
        q32_unit(type, T, U, b + 1 < nb, yb, a);
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
        _mm256_store_ps(acc + 16 * t, a[t]);
        _mm256_store_ps(acc + 16 * t + 8, a[T + t]);
    }
}

typedef void (*q32_fn)(const uint8_t *G, int nb, const block_q8a *const *y, float *acc, const uint8_t *end,
                       const cpu_next *nx, bool pf);
#define DEF_Q32(NAME, TYPE, T)                                                                                  \
    static __attribute__((noinline)) void NAME(const uint8_t *G, int nb, const block_q8a *const *y, float *acc, \
                                               const uint8_t *end, const cpu_next *nx, bool pf) {              \
        q32_group(TYPE, T, G, nb, y, acc, end, nx, pf);                                                         \
    }
#define DEF_Q32_T(N, TYPE) DEF_Q32(N##_t1, TYPE, 1) DEF_Q32(N##_t2, TYPE, 2) DEF_Q32(N##_t3, TYPE, 3) DEF_Q32(N##_t4, TYPE, 4)
DEF_Q32_T(q40, QT_Q4_0)
DEF_Q32_T(q41, QT_Q4_1)
DEF_Q32_T(q50, QT_Q5_0)
DEF_Q32_T(q51, QT_Q5_1)
DEF_Q32_T(q80, QT_Q8_0)
/* [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0][T] */
#define Q32_ROW(N) {NULL, N##_t1, N##_t2, N##_t3, N##_t4}
static const q32_fn q32_table[5][TCH + 1] = {Q32_ROW(q40), Q32_ROW(q41), Q32_ROW(q50), Q32_ROW(q51), Q32_ROW(q80)};

/* plain as in gemm_rp. */
static void gemm_q32(const int type, const bool plain, GEMM_ARGS, const cpu_next *nx) {
    DT_ASSERT(r0 >= 0 && r0 % REPACK_ROWS == 0);
    const int nb = k / QK32, g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS;
    const uint8_t *end = (const uint8_t *)w + (size_t)g1 * group_bytes;
    float acc[TCH * 16] __attribute__((aligned(32)));
    const block_q8a *y[TCH];
    for (int g = g0; g < g1; g++) {
        const int nr = DT_MIN(REPACK_ROWS, r1 - g * REPACK_ROWS);
        for (int c = 0, tc = 0, n; tc < n_tok; tc += n, c++) {
            n = chunk_len(n_tok, TCH, c);
            for (int t = 0; t < n; t++)
                y[t] = (const block_q8a *)(const void *)((const uint8_t *)act + (size_t)(tc + t) * act_bytes);
            q32_table[rp_q32_index((uint32_t)type)][n]((const uint8_t *)w + (size_t)g * group_bytes, nb, y, acc, end, nx,
                                                       tc == 0 && !(plain && n_tok == 1));
            for (int t = 0; t < n; t++)
                memcpy(out + (size_t)(tc + t) * out_stride + (size_t)g * REPACK_ROWS, acc + 16 * t, sizeof(float) * (size_t)nr);
        }
    }
}

#define PASS w, group_bytes, r0, r1, k, act, act_bytes, n_tok, out, out_stride
/* Per type, the kernels of the two forms: [0] with the one-token requests (near-far, and two-l1,
 * which has no AVX2 kernels of its own), [1] plain. */
#define DEF_GEMM(T, FN)                                                                                      \
    static void gemm_##T##_rp_avx2(GEMM_ARGS) { FN(QT_##T, false, PASS, NULL); }                              \
    static void gemm_##T##_rp_pl_avx2(GEMM_ARGS) { FN(QT_##T, true, PASS, NULL); }                            \
    static void gemm_##T##_rp_next_avx2(GEMM_ARGS, const cpu_next *nx) { FN(QT_##T, false, PASS, nx); }       \
    static void gemm_##T##_rp_next_pl_avx2(GEMM_ARGS, const cpu_next *nx) { FN(QT_##T, true, PASS, nx); }
DEF_GEMM(Q4_K, gemm_rp)
DEF_GEMM(Q5_K, gemm_rp)
DEF_GEMM(Q6_K, gemm_rp)
DEF_GEMM(Q4_0, gemm_q32)
DEF_GEMM(Q4_1, gemm_q32)
DEF_GEMM(Q5_0, gemm_q32)
DEF_GEMM(Q5_1, gemm_q32)
DEF_GEMM(Q8_0, gemm_q32)

#define ROW(T, NAME) {gemm_##T##_##NAME##_avx2, gemm_##T##_##NAME##_pl_avx2}
#define ROWS(NAME)                                                                                            \
    {ROW(Q4_K, NAME), ROW(Q5_K, NAME), ROW(Q6_K, NAME), ROW(Q4_0, NAME),                                      \
     ROW(Q4_1, NAME), ROW(Q5_0, NAME), ROW(Q5_1, NAME), ROW(Q8_0, NAME)}

quant_gemm_fn RP_NAME(repack_gemm_avx2)(uint32_t type, enum cpu_stream form) {
    static const quant_gemm_fn k[RP_TYPES][2] = ROWS(rp);
    const int r = rp_type_row(type);
    return r < 0 ? NULL : k[r][cpu_stream_no_requests(form)];
}

repack_gemm_next_fn RP_NAME(repack_gemm_next_avx2)(uint32_t type, enum cpu_stream form) {
    static const repack_gemm_next_fn k[RP_TYPES][2] = ROWS(rp_next);
    const int r = rp_type_row(type);
    return r < 0 ? NULL : k[r][cpu_stream_no_requests(form)];
}
