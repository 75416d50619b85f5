/* repack.c — the repacked (row-interleaved) layouts of Q4_K, Q5_K, Q6_K and the 32-weight-block types, the repack itself, a
 * scalar kernel on the repacked layout (bitwise equal to the reference in quant.c) and the
 * per-level dispatch. See repack.h. */
#include "cpu/repack.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---- layouts ------------------------------------------------------------------------------
 *
 * The matrix is a sequence of row groups, each one contiguous stream read front to back:
 *
 *   matrix: | group 0 (rows 0..15) | group 1 (rows 16..31) | ... | last group (zero-padded) |
 *   Q4_K group:  | block 0 | block 1 | ... | block nb-1 |           each block 2304 B
 *   Q6_K group:  | D header | block 0 | block 1 | ... | block nb-1 |  each block 3328 B
 *
 * A "dword vector" below is a 64-byte vector of 16 dword lanes, lane r = row r of the group
 * (row g*16 + r), so lane r occupies bytes 4r .. 4r+3. A weight vector (vpdpbusd's u8
 * operand) holds in lane r 4 consecutive bytes of that row's original qs / ql / qh array.
 *
 * Q4_K — group g = nb blocks of 2304 B, block b at g*group_bytes + b*2304 (all 64-aligned):
 *
 *   +0     d[16]     fp16, row r at +2r                        (32 B)
 *   +32    dmin[16]  fp16                                      (32 B)
 *   +64    SC0       dword vector: lane r = scales_r[0..3]     (64 B)   the original 12-byte
 *   +128   SC1       dword vector: lane r = scales_r[4..7]     (64 B)   6-bit packing, decoded
 *   +192   SC2       dword vector: lane r = scales_r[8..11]    (64 B)   for 16 rows at once
 *   +256   Q[0..31]  32 dword vectors: Q[v] lane r = qs_r[4v .. 4v+3]      (2048 B)
 *
 *          Q[v], v = 8p + i (p = 0..3, i = 0..7), one byte = two weights of row r:
 *          +-------- lane 0 --------+-------- lane 1 --------+ ... +-------- lane 15 -------+
 *          | qs0[4v] .. qs0[4v+3]   | qs1[4v] .. qs1[4v+3]   | ... | qs15[4v] .. qs15[4v+3] |
 *          +------------------------+------------------------+ ... +------------------------+
 *          Q[v] & 0x0F        = weights 64p + 4i .. +3      (sub-block 2p)   of rows 0..15
 *          (Q[v] >> 4) & 0x0F = weights 64p + 32 + 4i .. +3 (sub-block 2p+1) of rows 0..15
 *
 * Q5_K — blocks of 2816 B: Q4_K's header, the 5th bits, then Q4_K's quant vectors, so that a
 * kernel that needs H with the first quant vectors reads the block front to back:
 *
 *   +0     d, dmin, SC0..SC2   as Q4_K's +0 .. +255                           (256 B)
 *   +256   H[0..7]   8 dword vectors: H[v] lane r = qh_r[4v .. 4v+3]          (512 B)
 *   +768   Q[0..31]  as Q4_K's +256 .. +2303                                  (2048 B)
 *
 *          bit j of H[v]'s bytes = 5th bit of weights 32j + 4v .. +3 (sub-block j), the
 *          weights whose low 4 bits Q[8*(j/2) + v] holds (low nibbles for even j).
 *
 * Q6_K — group g = a header of the nb blocks' d, then nb blocks of 3328 B (all 64-aligned):
 *
 *   +0                  D[b][16]  fp16 d of block b, row r at +32b + 2r  (H = nb*32 B rounded up to 64)
 *   +H + b*3328         52 lines, in the order the one-token kernel reads them (one ascending
 *                       stream), for half h = 0..1 at +1664h:
 *
 *                       | L[16h] L[16h+8] Hh[8h] | L[16h+1] L[16h+9] Hh[8h+1] | ... | L[16h+7] L[16h+15] Hh[8h+7] | S[4h..4h+3] |
 *
 *                       L[v]  dword vector, lane r = ql_r[4v .. 4v+3]   (32 of them, 2048 B)
 *                       Hh[v] dword vector, lane r = qh_r[4v .. 4v+3]   (16, 1024 B)
 *                       S[p]  word vector (32 B, 32 lanes of 2 bytes), lane r = int8 scales_r[2p],
 *                             scales_r[2p+1] (vpmovsxbw gives vpdpwssd's int16 pairs directly)
 *                       (offsets: rp_q6k_l / rp_q6k_h / rp_q6k_s in repack.h)
 *
 *          With h = 0..1, i = 0..7, u = 6-bit unsigned quant (q + 32):
 *            L[16h + i]     & 0x0F  = low 4 bits of u at 128h +      4i .. +3
 *            L[16h + 8 + i] & 0x0F  =                     128h + 32 + 4i .. +3
 *            L[16h + i]     >> 4    =                     128h + 64 + 4i .. +3
 *            L[16h + 8 + i] >> 4    =                     128h + 96 + 4i .. +3
 *            Hh[8h + i] bits 2s..2s+1 = high 2 bits of u at 128h + 32s + 4i .. +3 (s = 0..3)
 *
 * Both are the original per-row byte arrays interleaved 4 bytes at a time across 16 rows, so
 * the repacked matrix has the original size (Q6_K with odd nb: + 32 header bytes per group);
 * the padding rows of the last group are zero (d = 0, quants 0) and their outputs are never
 * stored. The repacked bytes are a function of the source alone (padding always zeroed).
 *
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-weight blocks, nb = k/32) — group g = ceil(nb/2) units, each
 * two blocks (2u, 2u+1) of the 16 rows; unit u at g*group_bytes + u*U (rp_q32_* in repack.h):
 *
 *   +0    d[16] of block 2u, fp16 (32 B) | d[16] of block 2u+1 (32 B)
 *   +64   m[16] of block 2u      (32 B) | m[16] of block 2u+1  (32 B)     Q4_1, Q5_1 only
 *   then for block 2u, then 2u+1:
 *         H     5th-bit dword vector (64 B), lane r = block's qh_r permuted  Q5_0, Q5_1 only
 *         V[0..3] (Q8_0: V[0..7]) weight vectors, V[v] lane r = qs_r[4v .. 4v+3]
 *
 *   U = 576 B (Q4_0), 640 (Q4_1), 704 (Q5_0), 768 (Q5_1), 1088 (Q8_0): 9-17 lines.
 *   4-bit types: V[v] & 0x0F = low 4 bits of weights 4v .. 4v+3, V[v] >> 4 those of 16 + 4v .. +3;
 *   Q8_0: V[v] = int8 weights 4v .. 4v+3 as stored.
 *   H lane r: bit 8b + v = 5th bit of weight 4v + b, bit 8b + 4 + v = that of weight 16 + 4v + b
 *   (b, v = 0..3; the block's qh has weight i's at bit i), so V[v]'s 5th bits sit at bit v (low
 *   nibbles) and bit 4 + v (high nibbles) of each byte of H.
 *   w = d*(q - 8) (Q4_0), d*q + m (Q4_1), d*(q - 16) (Q5_0), d*q + m (Q5_1), d*q (Q8_0).
 *
 * With nb odd the last unit's second block is zero and no kernel reads it. */

static_assert(offsetof(block_q5_K, d) == offsetof(block_q4_K, d) && offsetof(block_q5_K, dmin) == offsetof(block_q4_K, dmin) &&
                  offsetof(block_q5_K, scales) == offsetof(block_q4_K, scales),
              "Q5_K's d, dmin and scales sit where Q4_K's do");
static_assert(RP_Q5K_QH == RP_Q4K_QS && RP_Q5K_QS == RP_Q5K_QH + 512 && RP_Q5K_BLOCK == RP_Q5K_QS + 2048 &&
                  RP_Q4K_BLOCK == RP_Q4K_QS + 2048,
              "Q5_K block: Q4_K's header, 8 5th-bit vectors, 32 quant vectors");

bool repack_supported(uint32_t type) {
    return type == QT_Q4_K || type == QT_Q5_K || type == QT_Q6_K || rp_is_q32(type);
}

/* Weights per block of a supported type. */
static int rp_qk(uint32_t type) { return rp_is_q32(type) ? QK32 : QK_K; }

/* A 32-weight block's m, qh and qs offsets (m, qh: 0 where it has none). */
static size_t q32_m_off(uint32_t t) { return t == QT_Q4_1 ? offsetof(block_q4_1, m) : t == QT_Q5_1 ? offsetof(block_q5_1, m) : 0; }
static size_t q32_qh_off(uint32_t t) { return t == QT_Q5_0 ? offsetof(block_q5_0, qh) : t == QT_Q5_1 ? offsetof(block_q5_1, qh) : 0; }
static size_t q32_qs_off(uint32_t t) {
    return t == QT_Q4_0 ? offsetof(block_q4_0, qs) : t == QT_Q4_1 ? offsetof(block_q4_1, qs) : t == QT_Q5_0 ? offsetof(block_q5_0, qs)
           : t == QT_Q5_1 ? offsetof(block_q5_1, qs) : offsetof(block_q8_0, qs);
}
/* A block's qh (bit i: weight i) as its H lane (layout above), and back. */
static uint32_t q32_h_of(uint32_t qh) {
    uint32_t h = 0;
    for (int v = 0; v < 4; v++)
        for (int b = 0; b < 4; b++) {
            h |= ((qh >> (4 * v + b)) & 1u) << (8 * b + v);
            h |= ((qh >> (16 + 4 * v + b)) & 1u) << (8 * b + 4 + v);
        }
    return h;
}
static uint32_t q32_qh_of(uint32_t h) {
    uint32_t qh = 0;
    for (int v = 0; v < 4; v++)
        for (int b = 0; b < 4; b++) {
            qh |= ((h >> (8 * b + v)) & 1u) << (4 * v + b);
            qh |= ((h >> (8 * b + 4 + v)) & 1u) << (16 + 4 * v + b);
        }
    return qh;
}

size_t repack_group_bytes(uint32_t type, int k) {
    DT_ASSERT(repack_supported(type) && k > 0 && k % rp_qk(type) == 0);
    const int nb = k / rp_qk(type);
    if (type == QT_Q4_K) return (size_t)nb * RP_Q4K_BLOCK;
    if (type == QT_Q5_K) return (size_t)nb * RP_Q5K_BLOCK;
    if (rp_is_q32(type)) return (size_t)((nb + 1) / 2) * rp_q32_unit(type);
    return rp_q6k_header(nb) + (size_t)nb * RP_Q6K_BLOCK;
}

size_t repack_bytes(uint32_t type, int rows, int k) {
    DT_ASSERT(rows >= 0);
    return (size_t)((rows + REPACK_ROWS - 1) / REPACK_ROWS) * repack_group_bytes(type, k);
}

/* 4-byte interleave: dst vector v lane r = src[4v .. 4v+3], for nv vectors. */
static inline void put_lanes(uint8_t *dst, int r, const uint8_t *src, int nv) {
    for (int v = 0; v < nv; v++) memcpy(dst + 64 * v + 4 * r, src + 4 * v, 4);
}
static inline void get_lanes(uint8_t *dst, const uint8_t *src, int r, int nv) {
    for (int v = 0; v < nv; v++) memcpy(dst + 4 * v, src + 64 * v + 4 * r, 4);
}
/* The same for Q6_K's L and Hh vectors, placed by rp_q6k_l / rp_q6k_h. */
static inline void put_q6k(uint8_t *B, int r, const block_q6_K *x) {
    for (int v = 0; v < 32; v++) memcpy(B + rp_q6k_l(v) + 4 * r, x->ql + 4 * v, 4);
    for (int v = 0; v < 16; v++) memcpy(B + rp_q6k_h(v) + 4 * r, x->qh + 4 * v, 4);
}
static inline void get_q6k(block_q6_K *x, const uint8_t *B, int r) {
    for (int v = 0; v < 32; v++) memcpy(x->ql + 4 * v, B + rp_q6k_l(v) + 4 * r, 4);
    for (int v = 0; v < 16; v++) memcpy(x->qh + 4 * v, B + rp_q6k_h(v) + 4 * r, 4);
}

void repack_rows(uint32_t type, const void *src, size_t row_bytes, int rows, int k, void *dst,
                 int g0, int g1) {
    DT_ASSERT(repack_supported(type) && k % rp_qk(type) == 0 && g0 >= 0 && g0 <= g1);
    DT_ASSERT((size_t)g1 * REPACK_ROWS <= (size_t)rows + REPACK_ROWS - 1);
    const int nb = k / rp_qk(type);
    const size_t gb = repack_group_bytes(type, k);
    for (int g = g0; g < g1; g++) {
        uint8_t *G = (uint8_t *)dst + (size_t)g * gb;
        if ((g + 1) * REPACK_ROWS > rows || (nb & 1 && rp_is_q32(type))) memset(G, 0, gb); /* padding rows, the odd last block */
        else if (type == QT_Q6_K) memset(G, 0, rp_q6k_header(nb)); /* the header's padding */
        for (int r = 0; r < REPACK_ROWS; r++) {
            const int row = g * REPACK_ROWS + r;
            if (row >= rows) break;
            const uint8_t *s = (const uint8_t *)src + (size_t)row * row_bytes;
            for (int b = 0; b < nb; b++) {
                if (rp_is_q32(type)) { /* d first in every 32-weight block */
                    const uint8_t *x = s + (size_t)b * quant_traits_of(type)->bytes;
                    uint8_t *U = G + (size_t)(b >> 1) * rp_q32_unit(type);
                    const int h = b & 1;
                    memcpy(U + rp_q32_d(h) + 2 * r, x, 2);
                    if (rp_q32_has_m(type)) memcpy(U + rp_q32_m(h) + 2 * r, x + q32_m_off(type), 2);
                    if (rp_q32_has_h(type)) {
                        uint32_t qh;
                        memcpy(&qh, x + q32_qh_off(type), 4);
                        const uint32_t hv = q32_h_of(qh);
                        memcpy(U + rp_q32_h(type, h) + 4 * r, &hv, 4);
                    }
                    put_lanes(U + rp_q32_v(type, h), r, x + q32_qs_off(type), rp_q32_nv(type));
                } else if (type == QT_Q4_K || type == QT_Q5_K) { /* d, dmin, scales at Q4_K's offsets in both */
                    const int q5 = type == QT_Q5_K;
                    const uint8_t *x = s + (size_t)b * (q5 ? sizeof(block_q5_K) : sizeof(block_q4_K));
                    uint8_t *B = G + (size_t)b * (q5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK);
                    memcpy(B + RP_Q4K_D + 2 * r, x + offsetof(block_q4_K, d), 2);
                    memcpy(B + RP_Q4K_DMIN + 2 * r, x + offsetof(block_q4_K, dmin), 2);
                    put_lanes(B + RP_Q4K_SC, r, x + offsetof(block_q4_K, scales), 3);
                    put_lanes(B + RP_Q45K_QS(q5), r, x + (q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)), 32);
                    if (q5) put_lanes(B + RP_Q5K_QH, r, x + offsetof(block_q5_K, qh), 8);
                } else {
                    const block_q6_K *x = (const block_q6_K *)(const void *)s + b;
                    uint8_t *B = G + rp_q6k_header(nb) + (size_t)b * RP_Q6K_BLOCK;
                    memcpy(G + 32 * b + 2 * r, &x->d, 2);
                    put_q6k(B, r, x);
                    for (int j = 0; j < 16; j++) B[rp_q6k_sc(j, r)] = (uint8_t)x->scales[j];
                }
            }
        }
    }
}

void repack_get_block(uint32_t type, const void *wp, size_t group_bytes, int k, int row, int b,
                      void *blk) {
    DT_ASSERT(repack_supported(type) && k % rp_qk(type) == 0 && row >= 0 && b >= 0 && b < k / rp_qk(type));
    const int nb = k / rp_qk(type), r = row % REPACK_ROWS;
    const uint8_t *G = (const uint8_t *)wp + (size_t)(row / REPACK_ROWS) * group_bytes;
    if (rp_is_q32(type)) {
        const uint8_t *U = G + (size_t)(b >> 1) * rp_q32_unit(type);
        const int h = b & 1;
        uint8_t *x = blk;
        memcpy(x, U + rp_q32_d(h) + 2 * r, 2);
        if (rp_q32_has_m(type)) memcpy(x + q32_m_off(type), U + rp_q32_m(h) + 2 * r, 2);
        if (rp_q32_has_h(type)) {
            uint32_t hv;
            memcpy(&hv, U + rp_q32_h(type, h) + 4 * r, 4);
            const uint32_t qh = q32_qh_of(hv);
            memcpy(x + q32_qh_off(type), &qh, 4);
        }
        get_lanes(x + q32_qs_off(type), U + rp_q32_v(type, h), r, rp_q32_nv(type));
    } else if (type == QT_Q4_K || type == QT_Q5_K) {
        const int q5 = type == QT_Q5_K;
        uint8_t *x = blk;
        const uint8_t *B = G + (size_t)b * (q5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK);
        memcpy(x + offsetof(block_q4_K, d), B + RP_Q4K_D + 2 * r, 2);
        memcpy(x + offsetof(block_q4_K, dmin), B + RP_Q4K_DMIN + 2 * r, 2);
        get_lanes(x + offsetof(block_q4_K, scales), B + RP_Q4K_SC, r, 3);
        get_lanes(x + (q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs)), B + RP_Q45K_QS(q5), r, 32);
        if (q5) get_lanes(x + offsetof(block_q5_K, qh), B + RP_Q5K_QH, r, 8);
    } else {
        block_q6_K *x = blk;
        const uint8_t *B = G + rp_q6k_header(nb) + (size_t)b * RP_Q6K_BLOCK;
        memcpy(&x->d, G + 32 * b + 2 * r, 2);
        get_q6k(x, B, r);
        for (int j = 0; j < 16; j++) x->scales[j] = (int8_t)B[rp_q6k_sc(j, r)];
    }
}

/* ---- scalar kernels on the repacked layout ---------------------------------------------------
 * Read each quant straight from its interleaved position; the integer sums and the fp32 chain
 * are the reference's (quant.c dot_kq_common / dot_q6_K), op for op. */

/* Byte of row lane r at byte index i of the row's original array, in dword vectors at V. */
static inline uint8_t lane_byte(const uint8_t *V, int r, int i) { return V[64 * (i >> 2) + 4 * r + (i & 3)]; }

/* Q4_K, and Q5_K with its 5th bits (q5: the block size tells the two apart). */
static float dot_q45_K_rp(const int q5, const uint8_t *G, int r, const block_q8k *y, int nb) {
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, y++) {
        const uint8_t *B = G + (size_t)b * (q5 ? RP_Q5K_BLOCK : RP_Q4K_BLOCK);
        uint8_t scales[K_SCALE_SIZE];
        for (int i = 0; i < K_SCALE_SIZE; i++) scales[i] = lane_byte(B + RP_Q4K_SC, r, i);
        fp16_t d, dmin;
        memcpy(&d, B + RP_Q4K_D + 2 * r, 2);
        memcpy(&dmin, B + RP_Q4K_DMIN + 2 * r, 2);
        int32_t I = 0, M = 0;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quant_k_scale_min(j, scales, &sc, &m);
            int32_t s = 0;
            for (int l = 0; l < 32; l++) {
                /* weight 32j + l: qs byte 32*(j/2) + l, low nibble for even j */
                const uint8_t byte = lane_byte(B + RP_Q45K_QS(q5), r, 32 * (j >> 1) + l);
                int q = (j & 1) ? byte >> 4 : byte & 0xF;
                if (q5) q |= ((lane_byte(B + RP_Q5K_QH, r, l) >> j) & 1) << 4; /* qh[l] bit j */
                s += q * y->q[32 * j + l];
            }
            I += (int32_t)sc * s;
            M += (int32_t)m * (y->bsums[2 * j] + y->bsums[2 * j + 1]);
        }
        acc = fmaf(fp16_to_f32(d) * y->d, (float)I, acc);
        acc = fmaf(-(fp16_to_f32(dmin) * y->d), (float)M, acc);
    }
    return acc;
}

static float dot_q4_K_rp(const uint8_t *G, int r, const block_q8k *y, int nb) { return dot_q45_K_rp(0, G, r, y, nb); }
static float dot_q5_K_rp(const uint8_t *G, int r, const block_q8k *y, int nb) { return dot_q45_K_rp(1, G, r, y, nb); }

static float dot_q6_K_rp(const uint8_t *G, int r, const block_q8k *y, int nb) {
    float acc = 0.0f;
    const uint8_t *B0 = G + rp_q6k_header(nb);
    for (int b = 0; b < nb; b++, y++) {
        const uint8_t *B = B0 + (size_t)b * RP_Q6K_BLOCK;
        fp16_t d;
        memcpy(&d, G + 32 * b + 2 * r, 2);
        int32_t I = 0;
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int l = 0; l < 16; l++) {
                const int e = 16 * j + l, h = e >> 7, quarter = (e >> 5) & 3, l32 = e & 31;
                const int il = 64 * h + l32 + ((quarter & 1) ? 32 : 0), ih = 32 * h + l32;
                const uint8_t lo = B[rp_q6k_l(il >> 2) + 4 * r + (il & 3)];
                const uint8_t hi = B[rp_q6k_h(ih >> 2) + 4 * r + (ih & 3)];
                const int u = ((quarter >= 2 ? lo >> 4 : lo & 0xF) | (((hi >> (2 * quarter)) & 3) << 4));
                s += (u - 32) * y->q[e];
            }
            I += (int32_t)(int8_t)B[rp_q6k_sc(j, r)] * s;
        }
        acc = fmaf(fp16_to_f32(d) * y->d, (float)I, acc);
    }
    return acc;
}

/* The 32-weight blocks: I = sum (q - off) * a, then the reference's chain (quant.c dot_q4_0 ..
 * dot_q8_0), with the m term for Q4_1 / Q5_1. */
static float dot_q32_rp(const uint32_t type, const uint8_t *G, int r, const block_q8a *y, int nb) {
    const int off = type == QT_Q4_0 ? 8 : type == QT_Q5_0 ? 16 : 0;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, y++) {
        const int h = b & 1;
        const uint8_t *U = G + (size_t)(b >> 1) * rp_q32_unit(type), *V = U + rp_q32_v(type, h);
        fp16_t d, m;
        uint32_t hv = 0;
        memcpy(&d, U + rp_q32_d(h) + 2 * r, 2);
        if (rp_q32_has_h(type)) memcpy(&hv, U + rp_q32_h(type, h) + 4 * r, 4);
        int32_t I = 0;
        for (int l = 0; l < QK32; l++) {
            int q;
            if (type == QT_Q8_0) q = (int8_t)lane_byte(V, r, l);
            else {
                const int i = l & 15, v = i >> 2, bb = i & 3;
                q = l < 16 ? lane_byte(V, r, i) & 0xF : lane_byte(V, r, i) >> 4;
                q |= (int)((hv >> (8 * bb + 4 * (l >> 4) + v)) & 1u) << 4; /* 0 without H */
            }
            I += (q - off) * y->q[l];
        }
        acc = fmaf(fp16_to_f32(d) * y->d, (float)I, acc);
        if (rp_q32_has_m(type)) {
            memcpy(&m, U + rp_q32_m(h) + 2 * r, 2);
            acc = fmaf(fp16_to_f32(m) * y->d, (float)y->s, acc);
        }
    }
    return acc;
}
#define DOT32(T, t) \
    static float dot_##t##_rp(const uint8_t *G, int r, const block_q8a *y, int nb) { return dot_q32_rp(T, G, r, y, nb); }
DOT32(QT_Q4_0, q4_0)
DOT32(QT_Q4_1, q4_1)
DOT32(QT_Q5_0, q5_0)
DOT32(QT_Q5_1, q5_1)
DOT32(QT_Q8_0, q8_0)

/* NAME: the generic gemm; NAME##_next: the same with repack_gemm_next's signature (the generic
 * kernels do not prefetch: nx is only a hint). */
#define RP_GEMM_GENERIC(NAME, DOT, QK, ACT)                                                        \
    static void NAME(const void *w, size_t group_bytes, int r0, int r1, int k, const void *act,    \
                     size_t act_bytes, int n_tok, float *out, size_t out_stride) {                 \
        const int nb = k / QK;                                                                     \
        for (int t = 0; t < n_tok; t++)                                                            \
            for (int r = r0; r < r1; r++)                                                          \
                out[(size_t)t * out_stride + (size_t)r] =                                          \
                    DOT((const uint8_t *)w + (size_t)(r / REPACK_ROWS) * group_bytes,              \
                        r % REPACK_ROWS,                                                           \
                        (const ACT *)(const void *)((const uint8_t *)act +                         \
                                                          (size_t)t * act_bytes),                  \
                        nb);                                                                       \
    }                                                                                              \
    static void NAME##_next(const void *w, size_t group_bytes, int r0, int r1, int k, const void *act, \
                            size_t act_bytes, int n_tok, float *out, size_t out_stride,            \
                            const struct cpu_next *nx) {                                           \
        (void)nx;                                                                                  \
        NAME(w, group_bytes, r0, r1, k, act, act_bytes, n_tok, out, out_stride);                   \
    }

RP_GEMM_GENERIC(gemm_q4_K_rp_generic, dot_q4_K_rp, QK_K, block_q8k)
RP_GEMM_GENERIC(gemm_q5_K_rp_generic, dot_q5_K_rp, QK_K, block_q8k)
RP_GEMM_GENERIC(gemm_q6_K_rp_generic, dot_q6_K_rp, QK_K, block_q8k)
RP_GEMM_GENERIC(gemm_q4_0_rp_generic, dot_q4_0_rp, QK32, block_q8a)
RP_GEMM_GENERIC(gemm_q4_1_rp_generic, dot_q4_1_rp, QK32, block_q8a)
RP_GEMM_GENERIC(gemm_q5_0_rp_generic, dot_q5_0_rp, QK32, block_q8a)
RP_GEMM_GENERIC(gemm_q5_1_rp_generic, dot_q5_1_rp, QK32, block_q8a)
RP_GEMM_GENERIC(gemm_q8_0_rp_generic, dot_q8_0_rp, QK32, block_q8a)

/* The generic kernels by type. */
static const struct {
    quant_gemm_fn gemm;
    repack_gemm_next_fn next;
} rp_generic[QT_COUNT] = {
    [QT_Q4_K] = {gemm_q4_K_rp_generic, gemm_q4_K_rp_generic_next},
    [QT_Q5_K] = {gemm_q5_K_rp_generic, gemm_q5_K_rp_generic_next},
    [QT_Q6_K] = {gemm_q6_K_rp_generic, gemm_q6_K_rp_generic_next},
    [QT_Q4_0] = {gemm_q4_0_rp_generic, gemm_q4_0_rp_generic_next},
    [QT_Q4_1] = {gemm_q4_1_rp_generic, gemm_q4_1_rp_generic_next},
    [QT_Q5_0] = {gemm_q5_0_rp_generic, gemm_q5_0_rp_generic_next},
    [QT_Q5_1] = {gemm_q5_1_rp_generic, gemm_q5_1_rp_generic_next},
    [QT_Q8_0] = {gemm_q8_0_rp_generic, gemm_q8_0_rp_generic_next},
};

/* The level whose kernel runs for (type, level): the highest at or below both `level` and
 * the hardware's that has one; the generic kernel always exists. */
static enum cpu_level rp_level(uint32_t type, enum cpu_level level) {
    const enum cpu_level hw = cpu_level_hw();
    if (level > hw) level = hw;
    if (level >= CPU_AVX512 && repack_gemm_avx512(type, CPU_STREAM_NEAR_FAR)) return CPU_AVX512;
    if (level >= CPU_AVX2 && repack_gemm_avx2(type, CPU_STREAM_NEAR_FAR)) return CPU_AVX2;
    return CPU_GENERIC;
}

quant_gemm_fn repack_gemm(uint32_t type, enum cpu_level level, enum cpu_stream form) {
    if (!repack_supported(type)) return NULL;
    switch (rp_level(type, level)) {
    case CPU_AVX512: return repack_gemm_avx512(type, form);
    case CPU_AVX2: return cpu_avx_vnni() ? repack_gemm_avx2vnni(type, form) : repack_gemm_avx2(type, form);
    default: return rp_generic[type].gemm;
    }
}

repack_gemm_next_fn repack_gemm_next(uint32_t type, enum cpu_level level, enum cpu_stream form) {
    if (!repack_supported(type)) return NULL;
    switch (rp_level(type, level)) {
    case CPU_AVX512: return repack_gemm_next_avx512(type, form);
    case CPU_AVX2: return cpu_avx_vnni() ? repack_gemm_next_avx2vnni(type, form) : repack_gemm_next_avx2(type, form);
    default: return rp_generic[type].next;
    }
}
