/* ab_kernel.c — in-process A/B of two versions of the AVX-512 repacked gemm kernels
 * (src/cpu/repack_avx512.c), built by bench/ab_kernel.sh with their entry points renamed to
 * repack_gemm_avx512_A / _B. Both run on the same repacked matrix and activations, alternating
 * A, B, A, B, ... in one process; prints the best time per side and the median of the
 * per-round B/A ratios (AB_ROUNDS=N sets the rounds: 8 for large matrices, 30 otherwise): on
 * this shared VM, separate runs drift by 20–40% between phases, alternating calls within a
 * process do not, though a best-of-8 ratio still moves 2–3% between identical sides.
 *
 *   ab_kernel ROWS NTOK TYPE(q4_k|q5_k|q6_k|q4_0|q8_0) THREADS [K=2048] [NMAT=1]
 * ROWS 32 keeps the matrix in cache (36 KB of Q4_K, 53 KB of Q6_K at k = 2048: the kernels'
 * compute speed); 400000 rows (~0.45 GiB) streams it from memory. NMAT > 1 copies of the matrix
 * run one after another with all threads (a barrier after each, as the model's stages do), e.g.
 * 1536 rows x 300 (0.5 GiB of expert-sized gate+up pairs) streams model-sized calls from memory.
 * Prints GB/s of weight bytes per side, and whether each side's output is bitwise equal to the
 * reference gemm (quant.c) — a kernel that is fast but wrong says so. THREADS should not exceed
 * the cores: the workers spin.
 * AB_LOADS=1 adds a third pass to every round: plain 256-bit loads of the same matrices' bytes
 * (each thread its rows' groups front to back, no software prefetch, no compute), and prints A
 * and B against it beside the slower and the faster half of its rounds (split at the midpoint of
 * its range): how much of the machine's stream each kernel form turns into gemm speed, in the
 * same seconds (bench/cpu-speed-log.md, thirty-first session). AB_LOADS=2 makes that pass the two-l1
 * form's pattern instead (loads_two). */
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common.h"
#include "cpu/prefetch.h"
#include "cpu/repack.h"
#include "gemm_job.h"
#include "quant.h"

/* form: enum cpu_stream (AB_FORM_A / AB_FORM_B: near-far, two-l1 or plain, default near-far); a
 * revision from before the forms takes one argument and ignores the second (one from before
 * the plain form runs near-far for it). */
quant_gemm_fn repack_gemm_avx512_A(uint32_t type, enum cpu_stream form);
quant_gemm_fn repack_gemm_avx512_B(uint32_t type, enum cpu_stream form);

static enum cpu_stream form_env(const char *name) {
    const int f = cpu_stream_parse(getenv(name)); /* unset or unknown: near-far */
    return f < 0 ? CPU_STREAM_NEAR_FAR : (enum cpu_stream)f;
}

/* A quant_gemm_fn that only reads rows [r0, r1)'s repacked groups (gb = the group's bytes, as
 * the repacked kernels take it): two 256-bit loads a line, XOR-folded, no output. */
static volatile uint64_t loads_sink;
__attribute__((target("avx2"))) static void loads_only(const void *w, size_t gb, int r0, int r1, int k,
                                                        const void *act, size_t ab, int nt, float *out, size_t os) {
    (void)k, (void)act, (void)ab, (void)nt, (void)out, (void)os;
    const uint8_t *p = (const uint8_t *)w + (size_t)(r0 / 16) * gb, *e = (const uint8_t *)w + (size_t)((r1 + 15) / 16) * gb;
    __m256i a0 = _mm256_setzero_si256(), a1 = a0;
    for (; p + 64 <= e; p += 64) {
        a0 = _mm256_xor_si256(a0, _mm256_load_si256((const __m256i *)(const void *)p));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256((const __m256i *)(const void *)(p + 32)));
    }
    loads_sink = (uint64_t)_mm256_extract_epi64(_mm256_xor_si256(a0, a1), 0);
}

/* loads_only in the two-l1 stream form's request pattern (cpu/prefetch.h, CPU_STREAM_TWO_L1),
 * the engine's loads-only form on such a host (cpu_backend.c, loads_only_rp_two) with 512-bit
 * loads as the kernels': the rows' groups in two halves read in lockstep, about a 256-weight
 * block's bytes at a time (rounded down to whole lines), each line requested CPU_PF2_DIST ahead
 * into L1; an odd last group after them. Every byte once (gb is a whole number of lines). */
__attribute__((target("avx512f"))) static void loads_two(const void *w, size_t gb, int r0, int r1, int k,
                                                         const void *act, size_t ab, int nt, float *out, size_t os) {
    (void)act, (void)ab, (void)nt, (void)out, (void)os;
    const int g0 = r0 / 16, g1 = (r1 + 15) / 16, h = (g1 - g0) / 2;
    const size_t nb = k >= QK_K ? (size_t)(k / QK_K) : 1, blk = DT_MAX((size_t)64, (gb / nb) & ~(size_t)63);
    const size_t half = (size_t)h * gb, tail = (size_t)(g1 - g0 - 2 * h) * gb;
    const uint8_t *const p[3] = {(const uint8_t *)w + (size_t)g0 * gb, p[0] + half, p[1] + half};
    __m512i a[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    for (size_t c = 0; c < half; c += blk)
        for (int s = 0; s < 2; s++)
            for (size_t o = c; o < DT_MIN(c + blk, half); o += 64) {
                _mm_prefetch((const char *)p[s] + o + CPU_PF2_DIST, _MM_HINT_T0);
                a[s] = _mm512_xor_si512(a[s], _mm512_load_si512((const void *)(p[s] + o)));
            }
    for (size_t o = 0; o < tail; o += 64) {
        _mm_prefetch((const char *)p[2] + o + CPU_PF2_DIST, _MM_HINT_T0);
        a[0] = _mm512_xor_si512(a[0], _mm512_load_si512((const void *)(p[2] + o)));
    }
    loads_sink = (uint64_t)_mm_cvtsi128_si64(_mm512_castsi512_si128(_mm512_xor_si512(a[0], a[1])));
}

static double med(double *v, int n) { /* sorts v (insertion sort: rounds are few) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double x = v[j];
            v[j] = v[j - 1], v[j - 1] = x;
        }
    return n ? (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2])) : 0.0;
}

/* Worker threads persist and spin between passes (a pass over a 1-5 MB matrix, as the model's
 * calls are, takes 20-100 us: thread creation per pass would dominate it). */
typedef struct {
    gemm_job jobs[16];
    int cnt[16];    /* matrices thread i runs, mstride apart from jobs[i].w */
    size_t mstride;
    int nth;
    _Atomic int gen, done, quit;
} team;

static void team_run(team *tm, int id) {
    for (int c = 0; c < tm->cnt[id]; c++) {
        gemm_job j = tm->jobs[id];
        j.w = (const uint8_t *)j.w + (size_t)c * tm->mstride;
        gemm_job_run(&j);
    }
}

static void *worker(void *p) {
    team *tm = p;
    static _Atomic int next_id = 1;
    const int id = next_id++;
    int seen = 0;
    for (;;) {
        int g;
        while ((g = tm->gen) == seen && !tm->quit) __builtin_ia32_pause();
        if (tm->quit) return NULL;
        seen = g;
        team_run(tm, id);
        tm->done++;
    }
}

/* One pass over all rows, split in nth contiguous 16-row-aligned parts; or, with st > 1, over st
 * matrices (mstride apart from base.w), thread i running its contiguous share of them whole, as
 * the model's stages hand each thread its own run of matrices (all writing the same out rows, the
 * same values: only the timing counts; with st < nth some threads get none); returns seconds. */
static double pass(team *tm, gemm_job base, int rows, int st) {
    const int nth = tm->nth, ng = (rows + 15) / 16;
    for (int i = 0; i < nth; i++) {
        tm->jobs[i] = base;
        if (st > 1) {
            const int m0 = st * i / nth;
            tm->jobs[i].w = (const uint8_t *)base.w + (size_t)m0 * tm->mstride;
            tm->jobs[i].r0 = 0, tm->jobs[i].r1 = rows, tm->cnt[i] = st * (i + 1) / nth - m0;
            continue;
        }
        tm->cnt[i] = 1;
        tm->jobs[i].r0 = (int)((long)ng * i / nth) * 16;
        tm->jobs[i].r1 = DT_MIN((int)((long)ng * (i + 1) / nth) * 16, rows);
    }
    const double t0 = time_now();
    tm->done = 0;
    tm->gen++;
    team_run(tm, 0);
    while (tm->done < nth - 1) __builtin_ia32_pause();
    return time_now() - t0;
}

static void *huge_alloc(size_t n) {
    const size_t al = (size_t)2 << 20, len = (n + al - 1) / al * al;
    void *p = aligned_alloc(al, len);
    DT_ASSERT(p);
    madvise(p, len, MADV_HUGEPAGE);
    memset(p, 0, len);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: ab_kernel ROWS NTOK q4_k|q5_k|q6_k|q4_0|q8_0 THREADS [K] [NMAT]\n");
        return 2;
    }
    const int rows = atoi(argv[1]), nt = atoi(argv[2]), nth = DT_MIN(16, atoi(argv[4]));
    const uint32_t type = !strcmp(argv[3], "q6_k")   ? QT_Q6_K
                          : !strcmp(argv[3], "q5_k") ? QT_Q5_K
                          : !strcmp(argv[3], "q4_0") ? QT_Q4_0
                          : !strcmp(argv[3], "q8_0") ? QT_Q8_0
                          : !strcmp(argv[3], "q4_k") ? QT_Q4_K
                                                     : QT_COUNT;
    if (type == QT_COUNT) {
        fprintf(stderr, "ab_kernel: TYPE must be q4_k, q5_k, q6_k, q4_0 or q8_0, not %s\n", argv[3]);
        return 2;
    }
    const int k = argc > 5 ? atoi(argv[5]) : 2048, nmat = argc > 6 ? atoi(argv[6]) : 1;
    if (rows <= 0 || nt <= 0 || nth <= 0 || (rows + 15) / 16 < nth || k <= 0 || k % QK_K || nmat <= 0) {
        fprintf(stderr, "ab_kernel: need ROWS >= 16 x THREADS, NTOK > 0, K a multiple of %d, NMAT > 0\n", QK_K);
        return 2;
    }
    const quant_traits *tr = quant_traits_of(type);
    const size_t rb = quant_row_bytes(type, k), rpm = repack_bytes(type, rows, k), gb = repack_group_bytes(type, k);
    /* random blocks with small fp16 scales (bits 0x2000-0x23ff: ~0.008-0.016), so sums stay finite */
    uint8_t *src = xmalloc(rb * (size_t)rows);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < rb * (size_t)rows; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        src[i] = (uint8_t)s;
    }
    const size_t bb = tr->bytes, nb = rb / bb;
    for (size_t b = 0; b < nb * (size_t)rows; b++) {
        uint8_t *B = src + b * bb;
        /* Q4_K, Q5_K: d, dmin at bytes 0..3; Q4_0, Q8_0: d at bytes 0..1; Q6_K: d at the last two bytes */
        const bool q6 = type == QT_Q6_K, one = q6 || type == QT_Q4_0 || type == QT_Q8_0;
        uint8_t *d = q6 ? B + bb - 2 : B;
        for (int h = 0; h < (one ? 1 : 2); h++) d[2 * h + 1] = (uint8_t)(0x20 | (d[2 * h + 1] & 3));
    }
    const size_t mstride = (rpm + 4095) / 4096 * 4096;
    uint8_t *wp = huge_alloc(mstride * (size_t)nmat);
    for (int m = 0; m < nmat; m++) repack_rows(type, src, rb, rows, k, wp + (size_t)m * mstride, 0, (rows + 15) / 16);
    const size_t ab = quant_act_bytes(tr->act, k);
    uint8_t *act = xmalloc(ab * (size_t)nt);
    float *xf = xmalloc((size_t)k * sizeof(float));
    for (int t = 0; t < nt; t++) {
        for (int i = 0; i < k; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            xf[i] = (float)((int)(s % 2001) - 1000) * 1e-3f;
        }
        quant_act_row(tr->act, xf, act + (size_t)t * ab, k);
    }
    const size_t on = (size_t)rows * (size_t)nt;
    float *ref = xmalloc(on * sizeof(float)), *out[2] = {xmalloc(on * sizeof(float)), xmalloc(on * sizeof(float))};
    tr->gemm(src, rb, 0, rows, k, act, ab, nt, ref, (size_t)rows);
    const quant_gemm_fn fn[2] = {repack_gemm_avx512_A(type, form_env("AB_FORM_A")),
                                 repack_gemm_avx512_B(type, form_env("AB_FORM_B"))};
    DT_ASSERT(fn[0] && fn[1]);
    static team tm;
    tm.nth = nth;
    tm.mstride = mstride;
    const int stage = getenv("AB_STAGE") ? DT_MAX(1, atoi(getenv("AB_STAGE"))) : 1;
    pthread_t th[16];
    for (int i = 1; i < nth; i++)
        if (pthread_create(&th[i], NULL, worker, &tm)) {
            fprintf(stderr, "ab_kernel: cannot start thread %d\n", i);
            return 1;
        }
    double best[2] = {1e30, 1e30};
    const double total = (double)rpm * nmat;
    const char *er = getenv("AB_ROUNDS"); /* more rounds: a steadier median */
    const int reps = (int)(2e8 / total) + 1, rounds = DT_MAX(1, DT_MIN(1000, er ? atoi(er) : total > 1e8 ? 8 : 30));
    double *ratio = xcalloc((size_t)rounds, sizeof(double)), tr_a = 0;
    const int loads_kind = getenv("AB_LOADS") ? atoi(getenv("AB_LOADS")) : 0;
    if (loads_kind < 0 || loads_kind > 2) {
        fprintf(stderr, "ab_kernel: AB_LOADS must be 0, 1 (plain loads) or 2 (the two-l1 pattern), not %d\n", loads_kind);
        return 2;
    }
    const bool with_loads = loads_kind > 0;
    const quant_gemm_fn loads_fn = loads_kind == 2 ? loads_two : loads_only;
    double *rate[3] = {xcalloc((size_t)rounds, sizeof(double)), xcalloc((size_t)rounds, sizeof(double)),
                       xcalloc((size_t)rounds, sizeof(double))}; /* GB/s per round: A, B, loads */
    float *sink = xmalloc(on * sizeof(float));
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < (with_loads ? 3 : 2); v++) {
            double t = 0;
            for (int i = 0; i < reps; i++)
                for (int m = 0; m < nmat; m += stage) {
                    const gemm_job base = {v < 2 ? fn[v] : loads_fn, wp + (size_t)m * mstride, gb, 0, rows, k, act, ab, nt,
                                           v < 2 ? out[v] : sink, (size_t)rows};
                    t += pass(&tm, base, rows, DT_MIN(stage, nmat - m));
                }
            rate[v][r] = total * reps / t / 1e9;
            if (v == 2) continue;
            if (t / reps < best[v]) best[v] = t / reps;
            if (v == 0) tr_a = t;
            else ratio[r] = tr_a / t;
        }
    med(ratio, rounds); /* sorts: the quartiles below */
    tm.quit = 1;
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    printf("%s rows %d k %d n_tok %d threads %d matrices %d:", tr->name, rows, k, nt, nth, nmat);
    for (int v = 0; v < 2; v++)
        printf("  %c %.2f GB/s%s", 'A' + v, total / best[v] / 1e9,
               memcmp(out[v], ref, on * sizeof(float)) ? " (NOT BITWISE EQUAL TO THE REFERENCE)" : "");
    printf("  B/A %.3f (best of %d rounds each); per-round B/A median %.3f, quartiles %.3f-%.3f\n", best[0] / best[1],
           rounds, ratio[rounds / 2], ratio[rounds / 4], ratio[(3 * rounds) / 4]);
    if (with_loads) { /* A and B against the loads-only pass of the same round, by the loads' half of their range */
        double lo = 1e300, hi = 0;
        for (int r = 0; r < rounds; r++) lo = DT_MIN(lo, rate[2][r]), hi = DT_MAX(hi, rate[2][r]);
        const double mid = 0.5 * (lo + hi);
        for (int h = 0; h < 2; h++) {
            double l[1000], a[1000], b[1000], al[1000], bl[1000];
            int n = 0;
            for (int r = 0; r < rounds; r++)
                if ((rate[2][r] >= mid) == (h == 1)) {
                    l[n] = rate[2][r], a[n] = rate[0][r], b[n] = rate[1][r];
                    al[n] = rate[0][r] / rate[2][r], bl[n] = rate[1][r] / rate[2][r], n++;
                }
            printf("  loads-only rounds %s %.1f GB/s: %d, loads %.2f GB/s, A %.2f (%.3f of the loads), B %.2f (%.3f)\n",
                   h ? "at or above" : "below", mid, n, med(l, n), med(a, n), med(al, n), med(b, n), med(bl, n));
        }
    }
    for (int v = 0; v < 3; v++) free(rate[v]);
    free(sink);
    free(ratio);
    free(src), free(wp), free(act), free(xf), free(ref), free(out[0]), free(out[1]);
    return 0;
}
