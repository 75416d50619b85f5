/* repack.h — row-interleaved ("repacked") weight matrices — Q4_K, Q5_K, Q6_K and the 32-weight-block
 * types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 — and their gemm kernels.
 *
 * A repacked matrix groups 16 consecutive rows (a row group; the last group is padded with
 * zero rows) and stores, for each block index b in ascending order, the 16 rows' block b
 * interleaved so that one 64-byte vector holds 4 consecutive weights of each of the 16 rows
 * (SIMD lane = row). `vpdpbusd(acc, W, broadcast(4 activation bytes))` then yields the 16
 * rows' partial sums with no horizontal reduction, and the per-row scales sit as vectors
 * (16 fp16 d, 16 dword lanes of 6-bit scale bytes, 16 int8 per Q6_K sub-block scale), so
 * the kernels need no gathers. Each group is one contiguous, sequential byte range.
 * The exact byte layouts are drawn above their code in repack.c.
 *
 * The kernels keep the arithmetic contract (docs/arithmetic.md): every (row, token) result
 * is bitwise equal to quant_traits_of(type)->gemm on the original row-major matrix —
 * integer block sums are exact, and each lane runs the reference's fp32 chain over blocks
 * in ascending order. tests/test_repack.c proves it.
 *
 * Repacked data is as large as the original (Q4_K, Q5_K, and the 32-weight-block types with k/32
 * even: exactly; Q6_K: plus 32 bytes per group when k/256 is odd; the 32-weight-block types with
 * k/32 odd: plus one zero block per row) plus the zero padding rows of the last group. */
#ifndef DITTO_REPACK_H
#define DITTO_REPACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/cpu_quant.h"
#include "quant.h"

#define REPACK_ROWS 16 /* rows per group */

/* Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. */
bool repack_supported(uint32_t type);
/* Bytes of one 16-row group for row length k (a multiple of the type's block: 256 or 32).
 * Multiple of 64. */
size_t repack_group_bytes(uint32_t type, int k);
/* Bytes of the whole repacked matrix: ceil(rows/16) groups. */
size_t repack_bytes(uint32_t type, int rows, int k);
/* Repacks rows [g0*16, g1*16) of a row-major matrix (`rows` rows of `row_bytes`, row length
 * k) into dst, the whole repacked matrix (group g at dst + g*repack_group_bytes). Rows at or
 * beyond `rows` become zero blocks. Thread-safe for disjoint group ranges; src is only read.
 * For best streaming speed dst should be 64-byte aligned. */
void repack_rows(uint32_t type, const void *src, size_t row_bytes, int rows, int k, void *dst,
                 int g0, int g1);
/* Copies weight block b of row `row` back out of a repacked matrix, in the original
 * block format (block_q4_K, block_q4_0, ...) — the inverse of repack_rows. */
void repack_get_block(uint32_t type, const void *wp, size_t group_bytes, int k, int row, int b,
                      void *blk);

/* The gemm on a repacked matrix, with quant_gemm_fn's signature:
 *   gemm(wp, group_bytes, r0, r1, k, act, act_bytes, n_tok, out, out_stride)
 * wp: the repacked matrix (group 0), group_bytes: repack_group_bytes(type, k); r0 a multiple
 * of 16, r1 > r0 anything (normally a multiple of 16 or the true row count): rows [r0, r1)
 * are stored at out[t*out_stride + r], nothing else is written (rows of the last, partial
 * group beyond r1 are computed but not stored). Activations as for the reference
 * (quant_act_row / cpu_quant_act_row: QA_Q8_256 for the K-quants, QA_Q8_32 for the 32-weight blocks, whose
 * block_q8a.s must be the sum of its q, as those make it: the SIMD kernels use it for the offsets). Bitwise equal to
 * the reference gemm.
 * level: CPU_GENERIC / CPU_AVX2 / CPU_AVX512; a level the hardware lacks (or without a
 * kernel) falls back to the next lower one; the generic kernel always exists. form: how the
 * one-token kernels stream the matrix (AVX-512: all three forms; AVX2: plain, or with its requests
 * for the other two; generic: ignored; same results). NULL for an unsupported type. */
quant_gemm_fn repack_gemm(uint32_t type, enum cpu_level level, enum cpu_stream form);

/* The same gemm, told what the calling thread reads right after the call (nx, may be NULL;
 * struct cpu_next in cpu/prefetch.h): the kernel's prefetch continues into it past the end
 * of rows [r0, r1). Results are repack_gemm's, bit for bit, whatever nx holds. The backend
 * calls this one; repack_gemm keeps quant_gemm_fn's signature for the tests and bench tools
 * that run repacked and row-major kernels through one job type. */
struct cpu_next;
typedef void (*repack_gemm_next_fn)(const void *w, size_t group_bytes, int r0, int r1, int k, const void *act,
                                    size_t act_bytes, int n_tok, float *out, size_t out_stride,
                                    const struct cpu_next *nx);
repack_gemm_next_fn repack_gemm_next(uint32_t type, enum cpu_level level, enum cpu_stream form);

/* Per-level tables (repack_avx512.c, repack_avx2.c); NULL where the level has no kernel. */
quant_gemm_fn repack_gemm_avx512(uint32_t type, enum cpu_stream form);
quant_gemm_fn repack_gemm_avx2(uint32_t type, enum cpu_stream form);
quant_gemm_fn repack_gemm_avx2vnni(uint32_t type, enum cpu_stream form); /* AVX-VNNI: only where cpu_avx_vnni() */
repack_gemm_next_fn repack_gemm_next_avx512(uint32_t type, enum cpu_stream form);
repack_gemm_next_fn repack_gemm_next_avx2(uint32_t type, enum cpu_stream form);
repack_gemm_next_fn repack_gemm_next_avx2vnni(uint32_t type, enum cpu_stream form);

/* ---- layout constants (shared by repack.c and the SIMD kernels) ---- */
/* Q4_K: a group is nb consecutive 2304-byte blocks. */
#define RP_Q4K_BLOCK 2304
#define RP_Q4K_D 0      /* fp16 d[16] */
#define RP_Q4K_DMIN 32  /* fp16 dmin[16] */
#define RP_Q4K_SC 64    /* 3 x 16 dwords: scales[0..3], [4..7], [8..11] of each row */
#define RP_Q4K_QS 256   /* 32 x 64 B: vector v, lane r = qs_r[4v .. 4v+3] */
/* The one-token Q4_K kernels' per-call min-term operands (q4k_hl in repack_avx512.c / repack_avx2.c):
 * 16 int8 a block, made on the stack for rows of at most RP_Q4K_HL_MAX blocks (k <= 131072); longer
 * rows take the min term from the activations' bsums in each block. */
#define RP_Q4K_HL_BYTES 16
#define RP_Q4K_HL_MAX 512
/* Q5_K: Q4_K's header (d, dmin, scales at the same offsets), then the 5th bits, then Q4_K's
 * quant vectors: a group is nb consecutive 2816-byte blocks, each read front to back by the
 * one-token kernels (the 5th bits are used with the first quant vectors). */
#define RP_Q5K_BLOCK 2816
#define RP_Q5K_QH 256 /* 8 x 64 B: vector v, lane r = qh_r[4v .. 4v+3] */
#define RP_Q5K_QS 768 /* 32 x 64 B, as RP_Q4K_QS */
#define RP_Q45K_QS(q5) ((q5) ? RP_Q5K_QS : RP_Q4K_QS)
/* Q6_K: a group is a header of nb x fp16 d[16] (padded to 64 bytes), then nb 3328-byte blocks. */
#define RP_Q6K_BLOCK 3328
/* A block is 52 lines read as one ascending stream by the one-token kernel: for each half h =
 * 0..1, for n = 0..7 the weight vectors L[16h + n], L[16h + 8 + n], Hh[8h + n] (L[v] lane r =
 * ql_r[4v .. 4v+3], Hh[v] lane r = qh_r[4v .. 4v+3]), then the half's scale pairs S[4h .. 4h+3]
 * (32 B each, lane r = int8 (scales_r[2p], scales_r[2p+1])). */
static inline size_t rp_q6k_l(int v) { return 64 * (size_t)(26 * (v >> 4) + 3 * (v & 7) + ((v >> 3) & 1)); }
static inline size_t rp_q6k_h(int v) { return 64 * (size_t)(26 * (v >> 3) + 3 * (v & 7) + 2); }
static inline size_t rp_q6k_s(int p) { return 64 * (size_t)(26 * (p >> 2) + 24) + 32 * (size_t)(p & 3); }
static inline size_t rp_q6k_sc(int j, int r) { return rp_q6k_s(j >> 1) + 2 * (size_t)r + (size_t)(j & 1); }
static inline size_t rp_q6k_header(int nb) { return ((size_t)nb * 32 + 63) & ~(size_t)63; }
/* The 32-weight-block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): a group is ceil(nb/2) units of two
 * blocks (h = 0, 1): a header of the 16 rows' fp16 d of both blocks (then m of both: Q4_1, Q5_1),
 * then per block its 5th-bit dword vector (Q5_0, Q5_1) and its weight vectors (4; Q8_0: 8). */
static inline bool rp_is_q32(uint32_t t) {
    return t == QT_Q4_0 || t == QT_Q4_1 || t == QT_Q5_0 || t == QT_Q5_1 || t == QT_Q8_0;
}
static inline int rp_q32_has_m(uint32_t t) { return t == QT_Q4_1 || t == QT_Q5_1; }
static inline int rp_q32_has_h(uint32_t t) { return t == QT_Q5_0 || t == QT_Q5_1; }
static inline int rp_q32_nv(uint32_t t) { return t == QT_Q8_0 ? 8 : 4; }
static inline size_t rp_q32_hdr(uint32_t t) { return rp_q32_has_m(t) ? 128 : 64; }
static inline size_t rp_q32_blk(uint32_t t) { return 64 * (size_t)(rp_q32_nv(t) + rp_q32_has_h(t)); }
static inline size_t rp_q32_unit(uint32_t t) { return rp_q32_hdr(t) + 2 * rp_q32_blk(t); }
/* Offsets in a unit: block h's d[16] and m[16] (fp16, row r at +2r), its 5th-bit vector and its
 * first weight vector. */
static inline size_t rp_q32_d(int h) { return 32 * (size_t)h; }
static inline size_t rp_q32_m(int h) { return 64 + 32 * (size_t)h; }
static inline size_t rp_q32_h(uint32_t t, int h) { return rp_q32_hdr(t) + (size_t)h * rp_q32_blk(t); }
static inline size_t rp_q32_v(uint32_t t, int h) { return rp_q32_h(t, h) + 64 * (size_t)rp_q32_has_h(t); }
/* What the SIMD kernels subtract, times the activation block's sum, from sum u*a with u the unsigned
 * quant they multiply (Q4_0: q - 8, Q5_0: q - 16, Q8_0: u = q ^ 0x80 = q + 128; Q4_1, Q5_1: 0). */
static inline int rp_q32_off(uint32_t t) { return t == QT_Q4_0 ? 8 : t == QT_Q5_0 ? 16 : t == QT_Q8_0 ? 128 : 0; }
/* A 32-weight-block type's row in the kernels' tables: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0. */
static inline int rp_q32_index(uint32_t t) {
    return t == QT_Q4_0 ? 0 : t == QT_Q4_1 ? 1 : t == QT_Q5_0 ? 2 : t == QT_Q5_1 ? 3 : 4;
}

/* Index of a repacked type in the SIMD levels' dispatch tables (rows Q4_K, Q5_K, Q6_K, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0), or -1. */
#define RP_TYPES 8
static inline int rp_type_row(uint32_t t) {
    static const uint32_t types[RP_TYPES] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0};
    for (int i = 0; i < RP_TYPES; i++)
        if (types[i] == t) return i;
    return -1;
}

#endif
