/* repack_avx512.c — AVX-512 (F/BW/VL/DQ + VNNI) gemm kernels on repacked Q4_K / Q5_K / Q6_K and 32-weight-block
 * matrices (layouts in repack.c), bitwise equal to the scalar reference in quant.c.
 *
 * One zmm weight vector W holds 4 consecutive quants (unsigned bytes) of each of the group's
 * 16 rows; s = vpdpbusd(s, W, broadcast(4 activation bytes)) adds each row's 4 products into
 * its own int32 lane, so a sub-block's per-row sums need no horizontal reduction. Then, per
 * lane and exactly in int32:
 *   Q4_K: I = sum_j sc_j * s_j (vpmulld), M = sum_j m_j * (bsum_2j + bsum_2j+1) (vpdpwssd on
 *         int16 pairs; at one token vpdpbusd on an exact int8 split of the pair sums, q4k_hl),
 *         and the reference chain acc = fma(d*da, (float)I, acc); acc = fma(-(dmin*da), (float)M, acc).
 *   Q6_K: u = q + 32 in 0..63 goes through vpdpbusd: s_j = sum u*a; then
 *         I = sum_j sc_j * s_j - 32 * sum_j sc_j * bsum_j (the second sum by vpdpwssd on int16
 *         (sc_2p, sc_2p+1) x (bsum_2p, bsum_2p+1) pairs) = sum_j sc_j * sum (u-32)*a, exactly;
 *         acc = fma(d*da, (float)I, acc).
 * Blocks ascend, so every lane runs the reference's fp32 chain op for op.
 *
 * int32 bounds (|a| <= 127 activations, as quant_act_row makes; vpdpbusd/vpdpwssd/vpmulld/
 * vpaddd are the non-saturating, wrapping forms, so only final values must fit):
 *   Q4_K: |s_j| <= 32*15*127 = 60960 (16*s_j <= 975360 for the high nibbles taken as 16*q),
 *         |sc_j*s_j| <= 63*60960 = 3.84e6, |I| <= 3.08e7;
 *         |bsum pair| <= 32*127 = 4064 (int16), |M| <= 8*63*4064 = 2.05e6.
 *   Q6_K: 0 <= |s_j| <= 16*63*127 = 128016, |sc_j*s_j| <= 128*128016 = 1.64e7, sum over 16
 *         <= 2.62e8; |bsum_j| <= 16*127 = 2032 (int16), |sum sc_j*bsum_j| <= 16*128*2032 =
 *         4.16e6, times 32 <= 1.33e8; final |I| <= 16*128*32*127*16 = 1.33e8. All < 2^31.
 *
 * Work order: per 16-row group, per block (ascending), the block's weight vectors are
 * unpacked from memory (AND / shift of the nibble and 2-bit planes) right where they are used,
 * for a chunk of up to 8 tokens at once (accumulators: 16 lanes x tokens; a noinline kernel
 * per token count 1..8 keeps everything in registers); more tokens take more chunks, which
 * find the block in L1. The 16 rows' scales are decoded in registers per chunk (no gathers).
 * One token (decode of a lone stream) has its own path: a whole 16-row group per call, the
 * accumulator in a register, the block's sub-block sums as interleaved chains (q45k_one,
 * q6k_one); in cache it runs 1.1-1.4x the chunk kernel's speed at T = 1 (bench/ab_kernel.sh).
 * The matrix is one sequential stream per group, software-prefetched CPU_PF_DIST bytes ahead into
 * L1 and CPU_PF_FAR into L2 (cpu/prefetch.h); at one token the host's stream form decides (the
 * CPU_STREAM_TWO_L1 form reads a call's groups as two lockstep halves, CPU_PF2_DIST (3.5 KiB) ahead into L1). */
#include <immintrin.h>
#include <string.h>

#include "cpu/prefetch.h"
#include "cpu/repack.h"

#define AI static inline __attribute__((always_inline))
#define TCH 8   /* tokens per chunk */
#define TSUP 64 /* tokens whose fp32 accumulators live on the stack at once */
#define PB_DWORDS 8192 /* stack room for the Q4_K pair sums of a chunk's tokens (32 KiB) */

#define GEMM_ARGS                                                                          \
    const void *w, size_t group_bytes, int r0, int r1, int k, const void *act,             \
        size_t act_bytes, int n_tok, float *out, size_t out_stride

AI __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}
#define LD(p) _mm512_loadu_si512((const void *)(p))

typedef struct {
    int8_t b[4];
} bytes4;
/* acc += vpdpbusd(W, broadcast of the 4 bytes at p), with the broadcast folded into the
 * instruction's memory operand ({1to16}; the compiler emits a separate vpbroadcastd). */
AI __m512i dp_bcast(__m512i acc, __m512i W, const int8_t *p) {
#ifdef RP_NO_ASM
    return _mm512_dpbusd_epi32(acc, W, bcast4(p));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(W), "m"(*(const bytes4 *)(const void *)p));
    return acc;
#endif
}

/* acc = fma(d*da, (float)I, acc) per lane — the reference's two roundings. */
AI __m512 chain(__m512 acc, __m512 d, float da, __m512i I) {
    return _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(I), acc);
}
/* acc = fma(-(dm*da), (float)M, acc), as fnmadd: -(p*M) + acc with one rounding is (-p)*M + acc
 * with one rounding, the same bits. */
AI __m512 chain_neg(__m512 acc, __m512 dm, float da, __m512i M) {
    return _mm512_fnmadd_ps(_mm512_mul_ps(dm, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(M), acc);
}

/* An opaque copy of a pointer: loads through it cannot be merged with loads through the
 * original, so the compiler re-loads weight vectors (cheap L1 hits) instead of keeping
 * dozens of them live in registers and spilling. */
AI const uint8_t *launder(const uint8_t *p) {
    __asm__("" : "+r"(p));
    return p;
}

/* The same for an activation block: each stream of a lockstep pair addresses the activations
 * through its own copy of the pointer, so the compiler does not keep the 64 broadcast addresses
 * of one block live for the other stream (it spilled them to the stack: 64 stores and reloads a
 * block pair). */
AI const block_q8k *launder_y(const block_q8k *p) {
    __asm__("" : "+r"(p));
    return p;
}

/* Makes v a register value the compiler cannot re-load: a weight vector used twice (Q & 0x0f,
 * Q & 0xf0) is loaded once instead of being folded into both ANDs as a memory operand (the
 * doubled loads cost 10-17% of the Q4_K kernel's in-cache speed at 1-8 tokens). */
AI __m512i in_reg(__m512i v) {
    __asm__ volatile("" : "+v"(v));
    return v;
}

/* Makes the compiler produce *v here, in a register: keeps each sub-block's vpmulld/vpaddd
 * in place instead of letting the scheduler sink them (and spill the partial sums). */
AI void pin(__m512i *v) { __asm__ volatile("" : "+v"(*v)); }

/* ---- Q4_K ----------------------------------------------------------------------------------
 * Weight vector (j, i), j = sub-block 0..7, i = 0..7: weights 32j + 4i .. +3 of the 16 rows =
 * low (j even) or high (j odd) nibbles of Q[8*(j/2) + i]; activation bytes q[32j + 4i .. +3].
 * Scales: quant_k_scale_min for 16 rows at once from the three dword vectors SC0..SC2 —
 * byte n of lane r of slo/shi/mlo/mhi = sc_n / sc_4+n / m_n / m_4+n of row r. */

AI __m512i q4k_slo(const uint8_t *B) { return _mm512_and_si512(LD(B + RP_Q4K_SC), _mm512_set1_epi8(0x3f)); }
AI __m512i q4k_shi(const uint8_t *B) {
    return _mm512_or_si512(_mm512_and_si512(LD(B + RP_Q4K_SC + 128), _mm512_set1_epi8(0x0f)),
                           _mm512_and_si512(_mm512_srli_epi32(LD(B + RP_Q4K_SC), 2), _mm512_set1_epi8(0x30)));
}
AI __m512i q4k_mlo(const uint8_t *B) { return _mm512_and_si512(LD(B + RP_Q4K_SC + 64), _mm512_set1_epi8(0x3f)); }
AI __m512i q4k_mhi(const uint8_t *B) {
    return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(LD(B + RP_Q4K_SC + 128), 4), _mm512_set1_epi8(0x0f)),
                           _mm512_and_si512(_mm512_srli_epi32(LD(B + RP_Q4K_SC + 64), 2), _mm512_set1_epi8(0x30)));
}
/* byte n of each dword -> zero-extended dword (vpshufb; index bytes 0x80 give zero) */
AI __m512i byte_to_dword(__m512i v, int n) {
    const __m512i idx = _mm512_set4_epi32((int)0x8080800c + n, (int)0x80808008 + n, (int)0x80808004 + n, (int)0x80808000 + n);
    return _mm512_shuffle_epi8(v, idx);
}
/* bytes (2h, 2h+1) of each dword -> two zero-extended int16 */
AI __m512i bytes_to_words(__m512i v, int h) {
    const int o = 0x00020002 * h;
    const __m512i idx = _mm512_set4_epi32((int)0x800d800c + o, (int)0x80098008 + o, (int)0x80058004 + o, (int)0x80018000 + o);
    return _mm512_shuffle_epi8(v, idx);
}

/* CPU_STREAM_TOUCH's reads of Q4_K block B (q5: a Q5_K block): at the start (v < 0) its lines up
 * to quant vector 0 (scales, Q5_K's 5th bits, vector 0: 5 or 13 lines, ascending), then before
 * quant vector v's load the line of vector v + 1. */
AI void q4k_touch(const uint8_t *B, int v, const int q5) {
    if (v < 0)
        for (int l = 0; l < RP_Q45K_QS(q5) / 64 + 1; l++) cpu_touch_line(B + 64 * l);
    else if (v + 1 < 32)
        cpu_touch_line(B + RP_Q45K_QS(q5) + 64 * (v + 1));
}

/* The requests of stream form f (cpu_prefetch_line_form) for the n 64-byte lines of block B
 * from line l on: a kernel with `spread` issues them beside its own loads of those lines. */
AI void pf_lines(const uint8_t *B, int l, int n, const int f) {
    for (int i = 0; i < n; i++) cpu_prefetch_line_form((const char *)B + 64 * (l + i), f);
}

/* acc += vpdpwssd(W, broadcast of the int16 pair at p), the broadcast in the memory operand. */
AI __m512i dpw_bcast(__m512i acc, __m512i W, const int16_t *p) {
#ifdef RP_NO_ASM
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_dpwssd_epi32(acc, W, _mm512_set1_epi32(v));
#else
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(W), "m"(*(const bytes4 *)(const void *)p));
    return acc;
#endif
}
/* The min term's M of one token from its pair sums, 16 rows at once: mp[p] lane r = int16
 * (m_2p, m_2p+1) of row r (bytes_to_words of mlo / mhi), pb = the token's four dwords
 * (bsum_4p + bsum_4p+1, bsum_4p+2 + bsum_4p+3) made once per call (q4k_pair_sums): four
 * vpdpwssd straight from memory, for the kernels that run several tokens against one block. */
AI __m512i q4k_min_sum_pb(const __m512i mp[4], const int32_t *pb) {
    __m512i M = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) M = dpw_bcast(M, mp[p], (const int16_t *)(const void *)(pb + p));
    return M;
}

/* The pair sums (bsum_2j + bsum_2j+1, j = 0..7, as int16; |.| <= 32*127) of one activation
 * block: dword p = pairs (2p, 2p+1). */
AI __m128i q4k_pair_sums_v(const block_q8k *y) {
    const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)y->bsums);
    return _mm256_cvtepi32_epi16(_mm256_madd_epi16(bs, _mm256_set1_epi16(1)));
}
/* The same into pb[0..3], for the multi-token kernels (q4k_min_sum_pb). */
AI void q4k_pair_sums(const block_q8k *y, int32_t *pb) { _mm_storeu_si128((__m128i *)(void *)pb, q4k_pair_sums_v(y)); }

/* The min term's M = sum_j m_j * (bsum_2j + bsum_2j+1) of one token, 16 rows at once: mp[p]
 * lane r = int16 (m_2p, m_2p+1) of row r (bytes_to_words of mlo / mhi). */
AI __m512i q4k_min_sum(const __m512i mp[4], const block_q8k *y) {
    const __m128i bp = q4k_pair_sums_v(y);
    __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], _mm512_broadcastd_epi32(bp));
    M = _mm512_dpwssd_epi32(M, mp[1], _mm512_broadcastd_epi32(_mm_shuffle_epi32(bp, 1)));
    M = _mm512_dpwssd_epi32(M, mp[2], _mm512_broadcastd_epi32(_mm_shuffle_epi32(bp, 2)));
    return _mm512_dpwssd_epi32(M, mp[3], _mm512_broadcastd_epi32(_mm_shuffle_epi32(bp, 3)));
}

/* The one-token kernel's min-term operand of one activation block, 16 bytes: the pair sums
 * ps_j = bsum_2j + bsum_2j+1 (j = 0..7, |ps_j| <= 32*127 = 4064) split exactly as
 * ps_j = 128 h_j + l_j with h_j = ps_j >> 7 in -32..31 and l_j = ps_j & 127:
 *   bytes 0..7 = h_0..h_7, bytes 8..15 = l_0..l_7 (int8; packs_epi16 cannot saturate): RP_Q4K_HL_BYTES. */
AI void q4k_hl(const block_q8k *y, int8_t *hl) {
    const __m128i ps = q4k_pair_sums_v(y);
    const __m128i h = _mm_srai_epi16(ps, 7), l = _mm_and_si128(ps, _mm_set1_epi16(127));
    _mm_storeu_si128((__m128i *)(void *)hl, _mm_packs_epi16(h, l));
}
/* M = sum_j m_j * ps_j of one token, 16 rows at once, from its q4k_hl operand: lane r's bytes of
 * mlo / mhi are m_0..3 / m_4..7 (unsigned, <= 63), so four vpdpbusd give
 * 128 * sum_j m_j h_j + sum_j m_j l_j (|M| <= 8*63*4064 = 2.05e6), with no int16 unpacking. */
AI __m512i q4k_min_sum_hl(__m512i mlo, __m512i mhi, const int8_t *hl) {
    const __m512i Mh = dp_bcast(dp_bcast(_mm512_setzero_si512(), mlo, hl), mhi, hl + 4);
    return dp_bcast(dp_bcast(_mm512_slli_epi32(Mh, 7), mlo, hl + 8), mhi, hl + 12);
}

/* Bit j of each byte of H at bit 4 (0x10), the rest zero. */
AI __m512i q5k_bit(__m512i H, const int j) {
    const __m512i h = j <= 4 ? _mm512_slli_epi16(H, 4 - j) : _mm512_srli_epi16(H, j - 4);
    return _mm512_and_si512(h, _mm512_set1_epi8(0x10)); /* 16-bit shifts: bit 4 of each byte is that byte's bit j */
}
/* T tokens (y[t]: their activation block) against one Q4_K block B (q5: a Q5_K block); acc: T x 16
 * floats. Sub-blocks go in pairs (2p, 2p+1) that share their quant bytes: each 64-byte vector Q is
 * loaded once and feeds both, as Q & 0x0f (sub-block 2p) and Q & 0xf0 = 16 q (2p+1, whose
 * sum is shifted back exactly). Q5_K or-s each quant's 5th bit in (bit j of the H vector's byte
 * for sub-block j, at bit 4), so u = q in 0..31 (|s_j| <= 32*31*127 = 125984, |I| <= 8*63*125984
 * = 6.35e7), and takes its high nibbles shifted down, not as 16q. Integer sums are order-free, so
 * I is the reference's. `spread` as in q45k_one. */
AI void q45k_tokens(const int q5, const int T, const uint8_t *B, const block_q8k *const *y, const int32_t *pb,
                    float *acc, const bool spread, const bool touch) {
    const int f = CPU_STREAM_NEAR_FAR; /* the chunk kernels' requests in every form (cpu/prefetch.h) */
    __m512i I[TCH];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) I[t] = _mm512_setzero_si512();
    if (spread) pf_lines(B, 32, q5 ? 12 : 4, f);
    if (touch) q4k_touch(B, -1, q5);
    const __m512i slo = q4k_slo(B), shi = q4k_shi(B);
    /* one mask, held in a register (hi = Q & ~m0f): with two constants GCC re-made both from
     * immediates beside every weight vector (2 mov + 2 vpbroadcastd each, 128 ops a block) */
    const __m512i m0f = in_reg(_mm512_set1_epi8(0x0f));
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
        __m512i se[TCH], so[TCH];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) se[t] = so[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            if (spread) pf_lines(B, 8 * p + i, 1, f);
            if (touch) q4k_touch(B, 8 * p + i, q5);
            const __m512i Q = in_reg(LD(B + RP_Q45K_QS(q5) + 64 * (8 * p + i)));
            __m512i lo = _mm512_and_si512(Q, m0f), hi = _mm512_andnot_si512(m0f, Q);
            if (q5) {
                const __m512i H = LD(B + RP_Q5K_QH + 64 * i);
                lo = _mm512_or_si512(lo, q5k_bit(H, 2 * p));
                hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Q, 4), m0f), q5k_bit(H, 2 * p + 1));
            }
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                se[t] = dp_bcast(se[t], lo, y[t]->q + 64 * p + 4 * i);
                so[t] = dp_bcast(so[t], hi, y[t]->q + 64 * p + 32 + 4 * i);
            }
        }
        const __m512i sce = byte_to_dword(p < 2 ? slo : shi, (2 * p) & 3);
        const __m512i sco = byte_to_dword(p < 2 ? slo : shi, (2 * p + 1) & 3);
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            I[t] = _mm512_add_epi32(I[t], _mm512_mullo_epi32(se[t], sce));
            I[t] = _mm512_add_epi32(I[t], _mm512_mullo_epi32(q5 ? so[t] : _mm512_srai_epi32(so[t], 4), sco));
            pin(&I[t]);
        }
    }
    const __m512i mlo = q4k_mlo(B), mhi = q4k_mhi(B);
    const __m512i mp[4] = {bytes_to_words(mlo, 0), bytes_to_words(mlo, 1), bytes_to_words(mhi, 0),
                           bytes_to_words(mhi, 1)};
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(B + RP_Q4K_D)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(B + RP_Q4K_DMIN)));
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        const __m512i M = q4k_min_sum_pb(mp, pb + 4 * t);
        __m512 a = _mm512_load_ps(acc + 16 * t);
        a = chain(a, d, y[t]->d, I[t]);
        a = chain_neg(a, dmin, y[t]->d, M);
        _mm512_store_ps(acc + 16 * t, a);
    }
}

/* The min term M of one token against Q4_K block B: from its q4k_hl operand hl, or (NULL) from y's bsums. */
AI __m512i q4k_min(const uint8_t *B, const block_q8k *y, const int8_t *hl) {
    const __m512i mlo = q4k_mlo(B), mhi = q4k_mhi(B);
    if (hl) return q4k_min_sum_hl(mlo, mhi, hl);
    const __m512i mp[4] = {bytes_to_words(mlo, 0), bytes_to_words(mlo, 1), bytes_to_words(mhi, 0),
                           bytes_to_words(mhi, 1)};
    return q4k_min_sum(mp, y);
}

/* One token against one Q4_K block B, returning the updated accumulator: the same integer sums
 * and fp32 chain as q45k_tokens(0, 1, ...), in another order. In the plain and two-l1 forms the
 * min term M comes first, from the block's header lines, and each sub-block pair's two sums (two
 * chains of 8 vpdpbusd) are scaled into I right after its 8 weight vectors (pinned there), so the
 * block's integer work is spread over its loads rather than left in a tail after them: from
 * memory 1.03-1.08x the tail order (per-round medians, two threads, plain; 0.755 -> 0.819 of plain
 * loads in fast rounds), in cache 0.99x. The near-far form keeps the tail (spread, 0.89x in cache;
 * not measured from memory on the Intel host it is for). bench/cpu-speed-log.md, thirty-third session.
 * With `spread`, each of the block's 36 lines has the requests for the lines CPU_PF_DIST and
 * CPU_PF_FAR ahead of it issued beside its load (cpu_prefetch_line) instead of in one burst before
 * the block; the caller says whether they lie within the call's rows.
 * q5: B is a Q5_K block (44 lines): its eight 5th-bit vectors are loaded once, right after the
 * header (the layout's order, repack.h), and each weight vector takes its 5th bits from them as
 * q45k_tokens does; the odd sub-blocks' sums are s_j itself (not 16 s_j). The same integer sums and
 * chain as q45k_tokens(1, 1, ...). Q5_K at one token ran through that chunk kernel before, with the
 * 5th bits after the quants and loaded beside each weight vector: at one thread from memory it read
 * 0.35-0.38 of plain loads in the plain and two-l1 forms and 0.74-0.83 in touch; with the layout and
 * this kernel ~0.90 plain, ~0.93 touch (bench/cpu-speed-log.md, forty-second session). */
AI __m512 q45k_one(const int q5, const uint8_t *B, const block_q8k *y, const int8_t *hl, __m512 a, const bool spread,
                   const int f) {
    const bool early = f != CPU_STREAM_NEAR_FAR;
    const __m512i m0f = _mm512_set1_epi8(0x0f), mf0 = _mm512_set1_epi8((char)0xf0);
    const bool touch = f == CPU_STREAM_TOUCH;
    if (spread) pf_lines(B, 32, q5 ? 12 : 4, f);
    if (touch) q4k_touch(B, -1, q5);
    const __m512i slo = q4k_slo(B), shi = q4k_shi(B);
    __m512i M = _mm512_setzero_si512();
    if (early) {
        M = q4k_min(B, y, hl);
        pin(&M);
    }
    /* Q4_K's odd sub-blocks' sums are 16 s_j exactly: summed unshifted (|.| <= 4*63*16*60960 = 2.46e8)
     * and shifted back once */
    __m512i se[4], so[4], Ie = _mm512_setzero_si512(), Io = _mm512_setzero_si512();
    __m512i H[8]; /* Q5_K's 5th-bit vectors, read once, in the stream's order */
    if (q5) _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) H[i] = in_reg(LD(B + RP_Q5K_QH + 64 * i));
    _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
        se[p] = so[p] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) {
            if (spread) pf_lines(B, 8 * p + i, 1, f);
            if (touch) q4k_touch(B, 8 * p + i, q5);
            const __m512i Q = in_reg(LD(B + RP_Q45K_QS(q5) + 64 * (8 * p + i)));
            __m512i lo = _mm512_and_si512(Q, m0f), hi = _mm512_and_si512(Q, mf0);
            if (q5) {
                lo = _mm512_or_si512(lo, q5k_bit(H[i], 2 * p));
                hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(Q, 4), m0f), q5k_bit(H[i], 2 * p + 1));
            }
            se[p] = dp_bcast(se[p], lo, y->q + 64 * p + 4 * i);
            so[p] = dp_bcast(so[p], hi, y->q + 64 * p + 32 + 4 * i);
        }
        if (early) {
            const __m512i sc = p < 2 ? slo : shi;
            Ie = _mm512_add_epi32(Ie, _mm512_mullo_epi32(se[p], byte_to_dword(sc, (2 * p) & 3)));
            Io = _mm512_add_epi32(Io, _mm512_mullo_epi32(so[p], byte_to_dword(sc, (2 * p + 1) & 3)));
            pin(&Ie);
            pin(&Io);
        }
    }
    if (!early) {
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i sc = p < 2 ? slo : shi;
            Ie = _mm512_add_epi32(Ie, _mm512_mullo_epi32(se[p], byte_to_dword(sc, (2 * p) & 3)));
            Io = _mm512_add_epi32(Io, _mm512_mullo_epi32(so[p], byte_to_dword(sc, (2 * p + 1) & 3)));
        }
        M = q4k_min(B, y, hl);
    }
    const __m512i I = _mm512_add_epi32(Ie, q5 ? Io : _mm512_srai_epi32(Io, 4));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(B + RP_Q4K_D)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(B + RP_Q4K_DMIN)));
    return chain_neg(chain(a, d, y->d, I), dmin, y->d, M);
}

/* ---- Q6_K ----------------------------------------------------------------------------------
 * Weight vector (j, i), j = sub-block 0..15, i = 0..3: u of weights 16j + 4i .. +3; with
 * e = 4j + i, h = e/32, s = (e/8)%4, n = e%8: low nibble of L[16h + 8*(s&1) + n] (s < 2) or
 * its high nibble (s >= 2), high two bits = bits 2s..2s+1 of Hh[8h + n]. */

AI __m512i q6k_w(const uint8_t *B, int j, int i) {
    const int e = 4 * j + i, h = e >> 5, s = (e >> 3) & 3, n = e & 7;
    const __m512i L = LD(B + rp_q6k_l(16 * h + 8 * (s & 1) + n));
    const __m512i H = LD(B + rp_q6k_h(8 * h + n));
    const __m512i lo = s < 2 ? _mm512_and_si512(L, _mm512_set1_epi8(0x0f))
                             : _mm512_and_si512(_mm512_srli_epi16(L, 4), _mm512_set1_epi8(0x0f));
    /* bits 2s..2s+1 to bits 4..5 (16-bit shifts; the bits that cross bytes are masked off) */
    const __m512i hs = s == 0 ? _mm512_slli_epi16(H, 4) : s == 1 ? _mm512_slli_epi16(H, 2)
                     : s == 2 ? H : _mm512_srli_epi16(H, 2);
    return _mm512_or_si512(lo, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)));
}

/* Scale pair p of the 16 rows: dword lane r = int16 (sc_2p, sc_2p+1), sign-extended. */
AI __m512i q6k_scpair(const uint8_t *B, int p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(const void *)(B + rp_q6k_s(p))));
}

/* T tokens against one Q6_K block B whose 16 fp16 d are at D.
 * I = sum_j sc_j * s_j - 32 * sum_j sc_j * bsum_j, with s_j = sum u*a over sub-block j
 * (vpdpbusd, u = q + 32 unsigned) and the second sum by vpdpwssd on int16 pairs. `spread` as in
 * q45k_one (52 lines: three per sub-block, four first). */
AI void q6k_tokens(const int T, const uint8_t *B, const uint8_t *D, const block_q8k *const *y, float *acc,
                   const bool spread) {
    __m512i I[TCH];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) I[t] = _mm512_setzero_si512();
    if (spread) pf_lines(B, 48, 4, CPU_STREAM_NEAR_FAR);
    _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) {
        if (spread) pf_lines(B, 3 * j, 3, CPU_STREAM_NEAR_FAR);
        const uint8_t *Bj = launder(B);
        __m512i s[TCH];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) s[t] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const __m512i W = q6k_w(Bj, j, i);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
                s[t] = dp_bcast(s[t], W, y[t]->q + 16 * j + 4 * i);
        }
        const __m512i pr = q6k_scpair(Bj, j >> 1);
        const __m512i sc = (j & 1) ? _mm512_srai_epi32(pr, 16) : _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16);
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            I[t] = _mm512_add_epi32(I[t], _mm512_mullo_epi32(s[t], sc));
            pin(&I[t]);
        }
    }
    __m512i Bs[TCH];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) Bs[t] = _mm512_setzero_si512();
    _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++) {
        const __m512i pr = q6k_scpair(B, p);
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
            Bs[t] = _mm512_dpwssd_epi32(Bs[t], pr, bcast4((const int8_t *)(const void *)(y[t]->bsums + 2 * p)));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)D));
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
        const __m512i It = _mm512_sub_epi32(I[t], _mm512_slli_epi32(Bs[t], 5));
        __m512 a = _mm512_load_ps(acc + 16 * t);
        a = chain(a, d, y[t]->d, It);
        _mm512_store_ps(acc + 16 * t, a);
    }
}

/* One token against one Q6_K block B (its 16 fp16 d at D), returning the updated accumulator:
 * the same integer sums and fp32 chain as q6k_tokens(1, ...), in another order. The four
 * weight vectors that share their loads (e = 32h + 8s + n, s = 0..3: nibble vectors L[16h + n],
 * L[16h + 8 + n], 2-bit vector H[8h + n]) are made together from three loads, each as
 * nibble | (2 bits & 0x30) in one vpternlogd; the 8 sub-block sums of a half h run as 8 chains.
 * `spread` as in q45k_one (52 lines: three beside each of the 16 load triples, four first). */
AI __m512 q6k_one(const uint8_t *B, const uint8_t *D, const block_q8k *y, __m512 a, const bool spread,
                 const int f) {
    const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    __m512i I = _mm512_setzero_si512();
    if (spread) pf_lines(B, 48, 4, f);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        __m512i sj[8]; /* sub-block 8h + k */
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) sj[k] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int n = 0; n < 8; n++) {
            if (spread) pf_lines(B, 3 * (8 * h + n), 3, f);
            const __m512i L0 = in_reg(LD(B + rp_q6k_l(16 * h + n)));
            const __m512i L1 = in_reg(LD(B + rp_q6k_l(16 * h + 8 + n)));
            const __m512i H = in_reg(LD(B + rp_q6k_h(8 * h + n)));
            /* u = nibble | (bits 2s..2s+1 of H at bits 4..5): A | (B & C) is ternary-logic 0xF8 */
            const __m512i u[4] = {
                _mm512_ternarylogic_epi32(_mm512_and_si512(L0, m0f), _mm512_slli_epi16(H, 4), m30, 0xF8),
                _mm512_ternarylogic_epi32(_mm512_and_si512(L1, m0f), _mm512_slli_epi16(H, 2), m30, 0xF8),
                _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L0, 4), m0f), H, m30, 0xF8),
                _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L1, 4), m0f), _mm512_srli_epi16(H, 2), m30,
                                          0xF8),
            };
            _Pragma("GCC unroll 4") for (int sq = 0; sq < 4; sq++) {
                const int k = 2 * sq + (n >> 2); /* e = 32h + 8sq + n is weight vector (8h + k, n & 3) */
                sj[k] = dp_bcast(sj[k], u[sq], y->q + 16 * (8 * h + k) + 4 * (n & 3));
            }
        }
        const uint8_t *Bh = launder(B); /* scales decoded here, not hoisted and spilled */
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {
            const __m512i pr = q6k_scpair(Bh, 4 * h + p);
            I = _mm512_add_epi32(I, _mm512_mullo_epi32(sj[2 * p], _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16)));
            I = _mm512_add_epi32(I, _mm512_mullo_epi32(sj[2 * p + 1], _mm512_srai_epi32(pr, 16)));
            pin(&I);
        }
    }
    __m512i Bs = _mm512_setzero_si512();
    const uint8_t *Bb = launder(B);
    _Pragma("GCC unroll 8") for (int p = 0; p < 8; p++)
        Bs = _mm512_dpwssd_epi32(Bs, q6k_scpair(Bb, p), bcast4((const int8_t *)(const void *)(y->bsums + 2 * p)));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)D));
    return chain(a, d, y->d, _mm512_sub_epi32(I, _mm512_slli_epi32(Bs, 5)));
}

/* ---- the gemm ------------------------------------------------------------------------------ */

/* One noinline kernel per (type, token count): T tokens x one block. */
/* pb: the tokens' pair sums for B (q4k_pair_sums, four dwords a token; Q4_K only). */
typedef void (*tok_fn)(const uint8_t *B, const uint8_t *D, const block_q8k *const *y, const int32_t *pb, float *acc,
                       bool spread);
/* Q4_K's and Q5_K's kernels of T tokens, named q4k_<P>T / q5k_<P>T, with or without q4k_touch. */
#define DEF_Q45(P, T, TOUCH)                                                                                  \
    static __attribute__((noinline)) void q4k_##P##T(const uint8_t *B, const uint8_t *D, const block_q8k *const *y, \
                                                     const int32_t *pb, float *acc, bool spread) {            \
        (void)D;                                                                                              \
        q45k_tokens(0, T, B, y, pb, acc, spread, TOUCH);                                                      \
    }                                                                                                         \
    static __attribute__((noinline)) void q5k_##P##T(const uint8_t *B, const uint8_t *D, const block_q8k *const *y, \
                                                     const int32_t *pb, float *acc, bool spread) {            \
        (void)D;                                                                                              \
        q45k_tokens(1, T, B, y, pb, acc, spread, TOUCH);                                                      \
    }
#define DEF_T(T)                                                                                              \
    DEF_Q45(t, T, false)                                                                                      \
    static __attribute__((noinline)) void q6k_t##T(const uint8_t *B, const uint8_t *D, const block_q8k *const *y, \
                                                   const int32_t *pb, float *acc, bool spread) {              \
        (void)pb;                                                                                             \
        q6k_tokens(T, B, D, y, acc, spread);                                                                  \
    }
DEF_T(1)
DEF_T(2)
DEF_T(3)
DEF_T(4)
DEF_T(5)
DEF_T(6)
DEF_T(7)
DEF_T(8)
/* The kernel tables' first index: the type. */
enum { RP_TI_Q4K, RP_TI_Q6K, RP_TI_Q5K, RP_TI_COUNT };
/* [RP_TI_*][T] */
static const tok_fn tok_table[RP_TI_COUNT][TCH + 1] = {
    {NULL, q4k_t1, q4k_t2, q4k_t3, q4k_t4, q4k_t5, q4k_t6, q4k_t7, q4k_t8},
    {NULL, q6k_t1, q6k_t2, q6k_t3, q6k_t4, q6k_t5, q6k_t6, q6k_t7, q6k_t8},
    {NULL, q5k_t1, q5k_t2, q5k_t3, q5k_t4, q5k_t5, q5k_t6, q5k_t7, q5k_t8},
};
/* CPU_STREAM_TOUCH's Q4_K / Q5_K chunk kernels of up to TOUCH_TOK tokens (cpu/prefetch.h): beside
 * their requests, each line first read by a 256-bit load (q4k_touch: a block's header lines, and Q5_K's
 * 5th-bit lines, at its start). At two tokens ~1.07x without, at four and six ~0.98x: their compute per
 * line bounds them. */
#define TOUCH_TOK 2
DEF_Q45(tt, 1, true)
DEF_Q45(tt, 2, true)
static const tok_fn tok_touch_table[RP_TI_COUNT][TOUCH_TOK + 1] = {
    {NULL, q4k_tt1, q4k_tt2}, {NULL, q6k_t1, q6k_t2}, {NULL, q5k_tt1, q5k_tt2}};

/* One token against one 16-row group (every block, the accumulators in registers): the
 * one-token path's loop without a call and an accumulator round trip per block. q45k_one /
 * q6k_one read each block front to back (the Q5_K and Q6_K layouts are ordered for it). Each
 * block's lines the stream form f's distances ahead (CPU_FORM_DIST / CPU_FORM_FAR, cpu/prefetch.h) are requested
 * line by line within it where they lie within `end`; near it, in a burst before the block,
 * continuing into nx past it. Spread
 * over the block, the requests read 1.09-1.14x the burst on the Intel host (bench/cpu-speed-log.md,
 * fourteenth session) and ~1.2x in cache; the multi-token kernels do the same in a block's first
 * chunk of up to 8 tokens (from memory 1.15-1.6x at 2-8 tokens, 1.3-1.4x at 16, 1.05-1.13x at 64).
 * acc: out, the group's 16 sums (the accumulators start at zero, as the reference's do). q5: Q5_K's
 * blocks (its min term from the same q4k_hl operands). */
AI void q45k_group1(const int q5, const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl, float *acc,
                    const uint8_t *end, const cpu_next *nx, const int f) {
    const size_t bb = q5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK;
    __m512 a = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *B = G + (size_t)b * bb;
        const bool spread = B + CPU_FORM_SPAN(f) + bb <= end;
        if (!spread) cpu_prefetch_ahead_form(B, bb, end, nx, f);
        a = q45k_one(q5, B, y + b, hl ? hl + RP_Q4K_HL_BYTES * b : NULL, a, spread, f);
    }
    _mm512_store_ps(acc, a);
}
AI void q4k_group1(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl, float *acc,
                   const uint8_t *end, const cpu_next *nx, const int f) {
    q45k_group1(0, G, nb, y, hl, acc, end, nx, f);
}
AI void q5k_group1(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl, float *acc,
                   const uint8_t *end, const cpu_next *nx, const int f) {
    q45k_group1(1, G, nb, y, hl, acc, end, nx, f);
}
AI void q6k_group1(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl, float *acc,
                   const uint8_t *end, const cpu_next *nx, const int f) {
    (void)hl;
    const uint8_t *B0 = G + rp_q6k_header(nb);
    cpu_prefetch_ahead_form(G, rp_q6k_header(nb), end, nx, f);
    __m512 a = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *B = B0 + (size_t)b * RP_Q6K_BLOCK;
        const bool spread = B + CPU_FORM_SPAN(f) + RP_Q6K_BLOCK <= end;
        if (!spread) cpu_prefetch_ahead_form(B, RP_Q6K_BLOCK, end, nx, f);
        a = q6k_one(B, G + 32 * b, y + b, a, spread, f);
    }
    _mm512_store_ps(acc, a);
}

/* One token against two groups G[0], G[1] in lockstep, block by block (CPU_STREAM_TWO_L1: two
 * streams, each with its own end[s] and continuation nx[s]); each group's chain is
 * q4k_group1's / q5k_group1's / q6k_group1's, op for op. acc: out, 2 x 16 sums. The Q4_K / Q5_K min term is made
 * from y's bsums in each block (q4k_min_sum), not from a call's q4k_hl operands: in this lockstep loop those
 * read 0.85x in cache (bench/cpu-speed-log.md, thirty-third session). */
AI void q45k_group2(const int q5, const uint8_t *const G[2], int nb, const block_q8k *y, float *acc,
                    const uint8_t *const end[2], const cpu_next *const nx[2]) {
    const int f = CPU_STREAM_TWO_L1;
    const size_t bb = q5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK;
    __m512 a[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int b = 0; b < nb; b++)
        _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) {
            const uint8_t *B = G[s] + (size_t)b * bb;
            const bool spread = B + CPU_FORM_SPAN(f) + bb <= end[s];
            if (!spread) cpu_prefetch_ahead_form(B, bb, end[s], nx[s], f);
            a[s] = q45k_one(q5, B, launder_y(y + b), NULL, a[s], spread, f);
        }
    _mm512_store_ps(acc, a[0]);
    _mm512_store_ps(acc + 16, a[1]);
}
static __attribute__((noinline)) void q4k_group2(const uint8_t *const G[2], int nb, const block_q8k *y, float *acc,
                                                 const uint8_t *const end[2], const cpu_next *const nx[2]) {
    q45k_group2(0, G, nb, y, acc, end, nx);
}
static __attribute__((noinline)) void q6k_group2(const uint8_t *const G[2], int nb, const block_q8k *y, float *acc,
                                                 const uint8_t *const end[2], const cpu_next *const nx[2]) {
    const int f = CPU_STREAM_TWO_L1;
    const size_t hdr = rp_q6k_header(nb);
    __m512 a[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) cpu_prefetch_ahead_form(G[s], hdr, end[s], nx[s], f);
    for (int b = 0; b < nb; b++)
        _Pragma("GCC unroll 2") for (int s = 0; s < 2; s++) {
            const uint8_t *B = G[s] + hdr + (size_t)b * RP_Q6K_BLOCK;
            const bool spread = B + CPU_FORM_SPAN(f) + RP_Q6K_BLOCK <= end[s];
            if (!spread) cpu_prefetch_ahead_form(B, RP_Q6K_BLOCK, end[s], nx[s], f);
            a[s] = q6k_one(B, G[s] + 32 * b, launder_y(y + b), a[s], spread, f);
        }
    _mm512_store_ps(acc, a[0]);
    _mm512_store_ps(acc + 16, a[1]);
}

static __attribute__((noinline)) void q5k_group2(const uint8_t *const G[2], int nb, const block_q8k *y, float *acc,
                                                 const uint8_t *const end[2], const cpu_next *const nx[2]) {
    q45k_group2(1, G, nb, y, acc, end, nx);
}

/* The one-token kernels, one per (type, stream form). */
/* hl: the token's q4k_hl operands, RP_Q4K_HL_BYTES a block (Q4_K, Q5_K; NULL: made from y's bsums in each block). */
typedef void (*one_fn)(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl, float *acc, const uint8_t *end,
                       const cpu_next *nx);
#define DEF_ONE(NAME, BODY, F)                                                                              \
    static __attribute__((noinline)) void NAME(const uint8_t *G, int nb, const block_q8k *y, const int8_t *hl,  \
                                               float *acc, const uint8_t *end, const cpu_next *nx) {        \
        BODY(G, nb, y, hl, acc, end, nx, F);                                                                \
    }
DEF_ONE(q4k_one_nf, q4k_group1, CPU_STREAM_NEAR_FAR)
DEF_ONE(q6k_one_nf, q6k_group1, CPU_STREAM_NEAR_FAR)
DEF_ONE(q4k_one_l1, q4k_group1, CPU_STREAM_TWO_L1)
DEF_ONE(q6k_one_l1, q6k_group1, CPU_STREAM_TWO_L1)
DEF_ONE(q5k_one_nf, q5k_group1, CPU_STREAM_NEAR_FAR)
DEF_ONE(q5k_one_l1, q5k_group1, CPU_STREAM_TWO_L1)
DEF_ONE(q4k_one_pl, q4k_group1, CPU_STREAM_PLAIN)
DEF_ONE(q6k_one_pl, q6k_group1, CPU_STREAM_PLAIN)
DEF_ONE(q5k_one_pl, q5k_group1, CPU_STREAM_PLAIN)
DEF_ONE(q4k_one_tc, q4k_group1, CPU_STREAM_TOUCH)
DEF_ONE(q5k_one_tc, q5k_group1, CPU_STREAM_TOUCH)
/* [RP_TI_*][enum cpu_stream]: the one-token kernels, and the two-group one (Q6_K
 * reads as fast as plain loads without touches: its kernel is plain's in CPU_STREAM_TOUCH) */
static const one_fn one_table[RP_TI_COUNT][CPU_STREAM_COUNT] = {{q4k_one_nf, q4k_one_l1, q4k_one_pl, q4k_one_tc},
                                                      {q6k_one_nf, q6k_one_l1, q6k_one_pl, q6k_one_pl},
                                                      {q5k_one_nf, q5k_one_l1, q5k_one_pl, q5k_one_tc}};
typedef void (*two_fn)(const uint8_t *const G[2], int nb, const block_q8k *y, float *acc, const uint8_t *const end[2],
                       const cpu_next *const nx[2]);
static const two_fn two_table[RP_TI_COUNT] = {q4k_group2, q6k_group2, q5k_group2};
/* Stores the sums of group g (16 lanes at acc) to out, rows below r1 only. */
static void store_group(float *out, int g, int r1, const float *acc) {
    const int nr = DT_MIN(REPACK_ROWS, r1 - g * REPACK_ROWS);
    _mm512_mask_storeu_ps(out + (size_t)g * REPACK_ROWS, (__mmask16)((1u << nr) - 1u), _mm512_load_ps(acc));
}

/* One token against groups [g0, g1) in stream form `form`. In CPU_STREAM_TWO_L1 the groups are
 * cut in two halves, [g0, gm) and [gm, g1) with gm = g0 + n/2, read in lockstep (the second half's
 * extra group, if any, alone at the end): each half is one ascending stream whose requests stop at
 * its own end, the second's continuing into nx as the single stream's do. */
/* The two halves of groups [g0, g1) in the two-l1 form (g1 - g0 >= 2): returns h, the groups per
 * half ([g0, g0 + h) and [g0 + h, g0 + 2h); an odd last group runs alone after them); ends[s] and
 * nxs[s] are stream s's end and continuation. Requests the second stream's first lines, which no
 * earlier request covers. */
static int two_halves(const uint8_t *w, size_t group_bytes, int g0, int g1, const uint8_t *end, const cpu_next *nx,
                      const uint8_t *ends[2], const cpu_next *nxs[2]) {
    const int h = (g1 - g0) / 2;
    ends[0] = w + (size_t)(g0 + h) * group_bytes, ends[1] = end;
    nxs[0] = NULL, nxs[1] = nx;
    const size_t lead = DT_MIN((size_t)CPU_PF2_DIST, (size_t)h * group_bytes);
    for (size_t o = 0; o < lead; o += 64) _mm_prefetch((const char *)ends[0] + o, CPU_PF_HINT);
    return h;
}

static void gemm_one(const int ti, const int form, const uint8_t *w, size_t group_bytes, int g0, int g1, int r1,
                     int nb, const block_q8k *y, float *out, const cpu_next *nx) {
    float acc[32] __attribute__((aligned(64)));
    int8_t hlbuf[RP_Q4K_HL_MAX * RP_Q4K_HL_BYTES];
    const int8_t *hl = NULL;
    if (ti != RP_TI_Q6K && nb <= RP_Q4K_HL_MAX) { /* Q4_K, Q5_K */
        for (int b = 0; b < nb; b++) q4k_hl(y + b, hlbuf + RP_Q4K_HL_BYTES * b);
        hl = hlbuf;
    }
    const uint8_t *end = w + (size_t)g1 * group_bytes;
    int g = g0;
    if (form == CPU_STREAM_TWO_L1 && g1 - g0 >= 2) {
        const uint8_t *ends[2];
        const cpu_next *nxs[2];
        const int h = two_halves(w, group_bytes, g0, g1, end, nx, ends, nxs), gm = g0 + h;
        for (; g < gm; g++) {
            const uint8_t *const G[2] = {w + (size_t)g * group_bytes, w + (size_t)(g + h) * group_bytes};
            two_table[ti](G, nb, y, acc, ends, nxs);
            store_group(out, g, r1, acc);
            store_group(out, g + h, r1, acc + 16);
        }
        g = gm + h;
    }
    const one_fn one = one_table[ti][form];
    for (; g < g1; g++) {
        one(w + (size_t)g * group_bytes, nb, y, hl, acc, end, nx);
        store_group(out, g, r1, acc);
    }
}

static void gemm_rp(const int type, const int form, GEMM_ARGS, const cpu_next *nx) {
    DT_ASSERT(r0 >= 0 && r0 % REPACK_ROWS == 0);
    const int is6 = type == QT_Q6_K, is5 = type == QT_Q5_K, ti = is5 ? RP_TI_Q5K : is6 ? RP_TI_Q6K : RP_TI_Q4K;
    const int nb = k / QK_K;
    const size_t bb = is6 ? RP_Q6K_BLOCK : is5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK;
    const size_t hdr = is6 ? rp_q6k_header(nb) : 0;
    const int g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS;
    float acc[TSUP * 16] __attribute__((aligned(64)));
    const uint8_t *end = (const uint8_t *)w + (size_t)g1 * group_bytes;
    const block_q8k *y[TCH];
    if (n_tok == 1) {
        gemm_one(ti, form, w, group_bytes, g0, g1, r1, nb, (const block_q8k *)act, out, nx);
        return;
    }
    /* Q4_K: every token's pair sums for every block, [block][token][4], made once per chunk of
     * tokens rather than once per group. Where nb is large a chunk has fewer than TSUP tokens, so
     * that they fit in pbuf; where not even one token's fit (k > 2^19), each block's are made as it
     * is used (pone). */
    int32_t pbuf[PB_DWORDS] __attribute__((aligned(64))), pone[4 * TCH] __attribute__((aligned(64)));
    const bool pre = !is6 && 4 * nb <= PB_DWORDS;
    int32_t *pb = pre ? pbuf : NULL;
    const int tsup = pre ? DT_MIN(TSUP, PB_DWORDS / (4 * nb)) : TSUP;
    for (int ts = 0; ts < n_tok; ts += tsup) {
        const int nt = DT_MIN(tsup, n_tok - ts);
        if (pb)
            for (int b = 0; b < nb; b++)
                for (int t = 0; t < nt; t++)
                    q4k_pair_sums((const block_q8k *)(const void *)((const uint8_t *)act + (size_t)(ts + t) * act_bytes) + b,
                                  pb + 4 * ((size_t)b * nt + t));
        for (int g = g0; g < g1; g++) {
            const uint8_t *G = (const uint8_t *)w + (size_t)g * group_bytes;
            for (int t = 0; t < nt; t++) _mm512_store_ps(acc + 16 * t, _mm512_setzero_ps());
            if (is6) cpu_prefetch_ahead(G, hdr, end, nx);
            for (int b = 0; b < nb; b++) {
                const uint8_t *B = G + hdr + (size_t)b * bb;
                /* the requests go beside the first chunk's loads */
                const bool spread = B + CPU_PF_SPAN + bb <= end;
                if (!spread) cpu_prefetch_ahead(B, bb, end, nx);
                /* chunks of up to 8 tokens; the block stays in L1 between them */
                for (int tc = 0; tc < nt; tc += TCH) {
                    const int n = DT_MIN(TCH, nt - tc);
                    for (int t = 0; t < n; t++)
                        y[t] = (const block_q8k *)(const void *)((const uint8_t *)act +
                                                                 (size_t)(ts + tc + t) * act_bytes) + b;
                    const int32_t *pt = is6 ? NULL : pb ? pb + 4 * ((size_t)b * nt + tc) : pone;
                    if (!is6 && !pre)
                        for (int t = 0; t < n; t++) q4k_pair_sums(y[t], pone + 4 * t);
                    const tok_fn kf = form == CPU_STREAM_TOUCH && n <= TOUCH_TOK ? tok_touch_table[ti][n] : tok_table[ti][n];
                    kf(B, G + 32 * b, y, pt, acc + 16 * tc, spread && tc == 0);
                }
            }
            const int nr = DT_MIN(REPACK_ROWS, r1 - g * REPACK_ROWS);
            const __mmask16 m = (__mmask16)((1u << nr) - 1u);
            for (int t = 0; t < nt; t++)
                _mm512_mask_storeu_ps(out + (size_t)(ts + t) * out_stride + (size_t)g * REPACK_ROWS, m,
                                      _mm512_load_ps(acc + 16 * t));
        }
    }
}

/* ---- the 32-weight blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 -------------------------------------
 * Per block and token, in int32 lanes: I = sum u*a - off*s with u the unsigned quant vpdpbusd
 * takes (4-bit types: the nibble, with the 5th bit from H at bit 4 for Q5_0 / Q5_1; Q8_0:
 * q ^ 0x80 = q + 128), off = 8 (Q4_0), 16 (Q5_0), 128 (Q8_0) or 0, and s the activation block's
 * sum, so I = sum (q - off')*a exactly (|sum u*a| <= 32*255*127 = 1.04e6); then acc = fma(d*da,
 * (float)I, acc) and, for Q4_1 / Q5_1, acc = fma(m*da, (float)s, acc), blocks ascending: the
 * reference's chain (quant.c dot_q4_0 .. dot_q8_0). Two partial sums per block (low and high
 * nibbles; even and odd vectors) halve the vpdpbusd dependency chain. A call runs whole 16-row
 * groups: for up to 8 tokens (a chunk) and S groups in lockstep (S = 2: the one-token
 * CPU_STREAM_TWO_L1 form) the accumulators stay in registers over the group's units; a chunk
 * after the first finds the group in L1/L2. */

/* T tokens x S groups against unit u of each group (blocks 2u and, if two, 2u+1): U[s] the
 * unit of group s, y[t] token t's block 2u, a[s*T + t] the accumulators. With `spread` the
 * unit's lines get form f's requests beside their loads. */
AI void q32_unit(const int type, const int T, const int S, const uint8_t *const *U, const int two,
                 const block_q8a *const *y, __m512 *a, const bool spread, const int f) {
    const uint32_t ty = (uint32_t)type;
    const int q8 = type == QT_Q8_0, nv = rp_q32_nv(ty), hm = rp_q32_has_m(ty), hh = rp_q32_has_h(ty);
    const int off = rp_q32_off(ty);
    const __m512i m0f = in_reg(_mm512_set1_epi8(q8 ? (char)0x80 : 0x0f));
    if (spread) _Pragma("GCC unroll 2") for (int s = 0; s < S; s++) pf_lines(U[s], 0, hm ? 2 : 1, f);
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
        if (h && !two) break;
        _Pragma("GCC unroll 2") for (int s = 0; s < S; s++) {
            const uint8_t *V = U[s] + rp_q32_v(ty, h);
            __m512i H = _mm512_setzero_si512();
            if (hh) {
                if (spread) pf_lines(U[s] + rp_q32_h(ty, h), 0, 1, f);
                H = LD(U[s] + rp_q32_h(ty, h));
            }
            __m512i s0[TCH], s1[TCH];
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                s0[t] = off ? _mm512_set1_epi32(-off * y[t][h].s) : _mm512_setzero_si512();
                s1[t] = _mm512_setzero_si512();
            }
            _Pragma("GCC unroll 8") for (int v = 0; v < nv; v++) {
                if (spread) pf_lines(V, v, 1, f);
                const __m512i Q = in_reg(LD(V + 64 * v));
                if (!q8) {
                    __m512i lo = _mm512_and_si512(Q, m0f);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(Q, 4), m0f);
                    if (hh) { /* weight vector v's 5th bits: bit v (low nibbles) and 4 + v (high) of H's bytes */
                        const __m512i m10 = _mm512_set1_epi8(0x10);
                        lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi32(H, 4 - v), m10));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi32(H, v), m10));
                    }
                    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                        s0[t] = dp_bcast(s0[t], lo, y[t][h].q + 4 * v);
                        s1[t] = dp_bcast(s1[t], hi, y[t][h].q + 16 + 4 * v);
                    }
                } else {
                    const __m512i W = _mm512_xor_si512(Q, m0f);
                    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                        if (v & 1) s1[t] = dp_bcast(s1[t], W, y[t][h].q + 4 * v);
                        else s0[t] = dp_bcast(s0[t], W, y[t][h].q + 4 * v);
                    }
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(U[s] + rp_q32_d(h))));
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)
                a[s * T + t] = chain(a[s * T + t], d, y[t][h].d, _mm512_add_epi32(s0[t], s1[t]));
            if (hm) {
                const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(U[s] + rp_q32_m(h))));
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) /* acc = fma(m*da, (float)s, acc) */
                    a[s * T + t] = _mm512_fmadd_ps(_mm512_mul_ps(m, _mm512_set1_ps(y[t][h].d)),
                                                   _mm512_set1_ps((float)y[t][h].s), a[s * T + t]);
            }
        }
    }
}

/* T tokens (y[t]: token t's activation row) x S groups G[s] (each with its stream's end[s] and
 * continuation nx[s]), every unit; acc: out, [s][t][16]. pf: request the weights (a chunk's
 * first pass over the groups). */
AI void q32_groups(const int type, const int T, const int S, const uint8_t *const *G, int nb, const block_q8a *const *y,
                   float *acc, const uint8_t *const *end, const cpu_next *const *nx, const int f, const bool pf) {
    const size_t ub = rp_q32_unit((uint32_t)type);
    __m512 a[2 * TCH];
    _Pragma("GCC unroll 16") for (int i = 0; i < S * T; i++) a[i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b += 2) {
        const uint8_t *U[2];
        bool spread = pf;
        _Pragma("GCC unroll 2") for (int s = 0; s < S; s++) {
            U[s] = G[s] + (size_t)(b / 2) * ub;
            if (pf && U[s] + CPU_FORM_SPAN(f) + ub > end[s]) {
                spread = false;
                cpu_prefetch_ahead_form(U[s], ub, end[s], nx[s], f);
            }
        }
        const block_q8a *yb[TCH];
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) yb[t] = y[t] + b;
        q32_unit(type, T, S, U, b + 1 < nb, yb, a, spread, f);
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < S * T; i++) _mm512_store_ps(acc + 16 * i, a[i]);
}

typedef void (*q32_fn)(const uint8_t *const *G, int nb, const block_q8a *const *y, float *acc,
                       const uint8_t *const *end, const cpu_next *const *nx, bool pf);
#define DEF_Q32(NAME, TYPE, T, S, F)                                                                          \
    static __attribute__((noinline)) void NAME(const uint8_t *const *G, int nb, const block_q8a *const *y,   \
                                               float *acc, const uint8_t *const *end,                        \
                                               const cpu_next *const *nx, bool pf) {                         \
        q32_groups(TYPE, T, S, G, nb, y, acc, end, nx, F, pf);                                               \
    }
#define DEF_Q32_T(NAME, TYPE)                                                                                 \
    DEF_Q32(NAME##_t1, TYPE, 1, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t2, TYPE, 2, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t3, TYPE, 3, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t4, TYPE, 4, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t5, TYPE, 5, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t6, TYPE, 6, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t7, TYPE, 7, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_t8, TYPE, 8, 1, CPU_STREAM_NEAR_FAR)                                                       \
    DEF_Q32(NAME##_l1x1, TYPE, 1, 1, CPU_STREAM_TWO_L1)                                                       \
    DEF_Q32(NAME##_l1x2, TYPE, 1, 2, CPU_STREAM_TWO_L1)                                                       \
    DEF_Q32(NAME##_pl, TYPE, 1, 1, CPU_STREAM_PLAIN)
DEF_Q32_T(q40, QT_Q4_0)
DEF_Q32_T(q41, QT_Q4_1)
DEF_Q32_T(q50, QT_Q5_0)
DEF_Q32_T(q51, QT_Q5_1)
DEF_Q32_T(q80, QT_Q8_0)
/* [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0][T] chunk kernels (index 0: the one-token two-l1 form, one group;
 * TCH + 1: two groups; TCH + 2: the one-token plain form) */
#define Q32_ROW(N) {N##_l1x1, N##_t1, N##_t2, N##_t3, N##_t4, N##_t5, N##_t6, N##_t7, N##_t8, N##_l1x2, N##_pl}
static const q32_fn q32_table[5][TCH + 3] = {Q32_ROW(q40), Q32_ROW(q41), Q32_ROW(q50), Q32_ROW(q51), Q32_ROW(q80)};

static void gemm_q32(const int type, const int form, GEMM_ARGS, const cpu_next *nx) {
    DT_ASSERT(r0 >= 0 && r0 % REPACK_ROWS == 0);
    const q32_fn *tab = q32_table[rp_q32_index((uint32_t)type)];
    const int nb = k / QK32, g0 = r0 / REPACK_ROWS, g1 = (r1 + REPACK_ROWS - 1) / REPACK_ROWS;
    const uint8_t *W = w, *end = W + (size_t)g1 * group_bytes;
    float acc[2 * TCH * 16] __attribute__((aligned(64)));
    const block_q8a *y[TCH];
    int g = g0;
    if (n_tok == 1 && form == CPU_STREAM_TWO_L1) { /* gemm_one's halves, in lockstep */
        y[0] = act;
        if (g1 - g0 >= 2) {
            const uint8_t *ends[2];
            const cpu_next *nxs[2];
            const int h = two_halves(W, group_bytes, g0, g1, end, nx, ends, nxs), gm = g0 + h;
            for (; g < gm; g++) {
                const uint8_t *const G[2] = {W + (size_t)g * group_bytes, W + (size_t)(g + h) * group_bytes};
                tab[TCH + 1](G, nb, y, acc, ends, nxs, true);
                store_group(out, g, r1, acc);
                store_group(out, g + h, r1, acc + 16);
            }
            g = gm + h;
        }
        for (; g < g1; g++) {
            const uint8_t *const G[1] = {W + (size_t)g * group_bytes};
            tab[0](G, nb, y, acc, &end, &nx, true);
            store_group(out, g, r1, acc);
        }
        return;
    }
    for (; g < g1; g++) {
        const uint8_t *const G[1] = {W + (size_t)g * group_bytes};
        for (int tc = 0; tc < n_tok; tc += TCH) {
            const int n = DT_MIN(TCH, n_tok - tc);
            for (int t = 0; t < n; t++)
                y[t] = (const block_q8a *)(const void *)((const uint8_t *)act + (size_t)(tc + t) * act_bytes);
            tab[n_tok == 1 && cpu_stream_no_requests(form) ? TCH + 2 : n](G, nb, y, acc, &end, &nx, tc == 0);
            for (int t = 0; t < n; t++) store_group(out + (size_t)(tc + t) * out_stride, g, r1, acc + 16 * t);
        }
    }
}

#define PASS w, group_bytes, r0, r1, k, act, act_bytes, n_tok, out, out_stride
#define DEF_GEMM(T, F, SUF)                                                                                 \
    static void gemm_##T##_rp##SUF(GEMM_ARGS) { gemm_rp(QT_##T, F, PASS, NULL); }                           \
    static void gemm_##T##_rp_next##SUF(GEMM_ARGS, const cpu_next *nx) { gemm_rp(QT_##T, F, PASS, nx); }
#define DEF_GEMM32(T, F, SUF)                                                                               \
    static void gemm_##T##_rp##SUF(GEMM_ARGS) { gemm_q32(QT_##T, F, PASS, NULL); }                          \
    static void gemm_##T##_rp_next##SUF(GEMM_ARGS, const cpu_next *nx) { gemm_q32(QT_##T, F, PASS, nx); }
DEF_GEMM32(Q4_0, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM32(Q4_1, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM32(Q5_0, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM32(Q5_1, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM32(Q8_0, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM32(Q4_0, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM32(Q4_1, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM32(Q5_0, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM32(Q5_1, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM32(Q8_0, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM(Q4_K, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM(Q5_K, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM(Q6_K, CPU_STREAM_NEAR_FAR, _nf)
DEF_GEMM(Q4_K, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM(Q5_K, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM(Q6_K, CPU_STREAM_TWO_L1, _l1)
DEF_GEMM32(Q4_0, CPU_STREAM_PLAIN, _pl)
DEF_GEMM32(Q4_1, CPU_STREAM_PLAIN, _pl)
DEF_GEMM32(Q5_0, CPU_STREAM_PLAIN, _pl)
DEF_GEMM32(Q5_1, CPU_STREAM_PLAIN, _pl)
DEF_GEMM32(Q8_0, CPU_STREAM_PLAIN, _pl)
DEF_GEMM(Q4_K, CPU_STREAM_PLAIN, _pl)
DEF_GEMM(Q5_K, CPU_STREAM_PLAIN, _pl)
DEF_GEMM(Q6_K, CPU_STREAM_PLAIN, _pl)
DEF_GEMM32(Q4_0, CPU_STREAM_TOUCH, _tc)
DEF_GEMM32(Q4_1, CPU_STREAM_TOUCH, _tc)
DEF_GEMM32(Q5_0, CPU_STREAM_TOUCH, _tc)
DEF_GEMM32(Q5_1, CPU_STREAM_TOUCH, _tc)
DEF_GEMM32(Q8_0, CPU_STREAM_TOUCH, _tc)
DEF_GEMM(Q4_K, CPU_STREAM_TOUCH, _tc)
DEF_GEMM(Q5_K, CPU_STREAM_TOUCH, _tc)
DEF_GEMM(Q6_K, CPU_STREAM_TOUCH, _tc)

#define FORMS(T, NAME) {gemm_##T##_##NAME##_nf, gemm_##T##_##NAME##_l1, gemm_##T##_##NAME##_pl, gemm_##T##_##NAME##_tc}
#define FORM_ROWS(NAME)                                                                                     \
    {FORMS(Q4_K, NAME), FORMS(Q5_K, NAME), FORMS(Q6_K, NAME), FORMS(Q4_0, NAME),                            \
     FORMS(Q4_1, NAME), FORMS(Q5_0, NAME), FORMS(Q5_1, NAME), FORMS(Q8_0, NAME)}

quant_gemm_fn repack_gemm_avx512(uint32_t type, enum cpu_stream form) {
    static const quant_gemm_fn k[RP_TYPES][CPU_STREAM_COUNT] = FORM_ROWS(rp);
    DT_ASSERT((unsigned)form < CPU_STREAM_COUNT);
    const int r = rp_type_row(type);
    return r < 0 ? NULL : k[r][form];
}

repack_gemm_next_fn repack_gemm_next_avx512(uint32_t type, enum cpu_stream form) {
    static const repack_gemm_next_fn k[RP_TYPES][CPU_STREAM_COUNT] = FORM_ROWS(rp_next);
    DT_ASSERT((unsigned)form < CPU_STREAM_COUNT);
    const int r = rp_type_row(type);
    return r < 0 ? NULL : k[r][form];
}
