/* bench_repack.c — weight-streaming speed of the repacked K-quant and 32-weight-block gemm (src/cpu/repack*.c)
 * against the row-major kernels (cpu_quant_gemm), on a matrix of >= SIZE GiB (default 1) with
 * rows of K (default 2048), at n_tok 1, 2, 4, 8, 16 and 1..THREADS threads (rows split in 16-row
 * groups). Prints GB/s of weight bytes and GMAC/s, best of REPS passes; also checks that the
 * two kernels' outputs are bitwise equal.
 *
 *   make BUILD=build-rp build-rp/libditto.a
 *   cc -std=c11 -D_GNU_SOURCE -O2 -iquote src -o build-rp/bench_repack bench/bench_repack.c \
 *      build-rp/libditto.a -lm -pthread
 *   ./build-rp/bench_repack [SIZE_GIB=1] [REPS=5] [THREADS=2] [LEVEL=avx512|avx2|generic]
 *                           [TYPES=q4_k,q6_k(,q5_k,q4_0,q4_1,q5_0,q5_1,q8_0)] [NTOK=1,2,4,8,16] [HUGE=0|1] [K=2048]
 * HUGE=1 backs both matrices with transparent huge pages (madvise(MADV_HUGEPAGE)).
 *
 *   ./build-rp/bench_repack gguf MODEL.gguf [LAYER=0 | NAME_PREFIX] [REPS=5]
 * Real weights: every repackable (repack_supported) tensor of block LAYER, or whose name starts with NAME_PREFIX
 * (e.g. output.), (3-d expert tensors as ne[2] matrices)
 * is repacked; every matrix's repacked gemm (generic, avx2, avx512) is checked bitwise against
 * the reference at n_tok 1, 3 and 8 on random activations, and each tensor is timed per matrix
 * (as the MoE calls it) at n_tok 1 and 4, one thread, row-major vs repacked.
 */
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu/cpu_quant.h"
#include "gguf.h"
#include "cpu/repack.h"
#include "quant.h"
#include "gemm_job.h"

static uint64_t rs = 0x9E3779B97F4A7C15ULL;
static inline uint64_t xs(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static int g_huge;
/* Zeroed, 2 MiB-aligned memory, with MADV_HUGEPAGE when g_huge. */
static void *big_alloc(size_t n) {
    const size_t al = (size_t)2 << 20, len = (n + al - 1) / al * al;
    uint8_t *p = mmap(NULL, len + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    DT_ASSERT(p != MAP_FAILED);
    uint8_t *q = (uint8_t *)(((uintptr_t)p + al - 1) & ~(uintptr_t)(al - 1));
    if (q > p) munmap(p, (size_t)(q - p));
    if (p + len + al > q + len) munmap(q + len, (size_t)(p + len + al - (q + len)));
    if (g_huge) madvise(q, len, MADV_HUGEPAGE);
    memset(q, 0, n);
    return q;
}
static void big_free(void *q, size_t n) {
    const size_t al = (size_t)2 << 20;
    munmap(q, (n + al - 1) / al * al);
}

/* One pass with nth threads over all rows; returns seconds. */
static double pass(quant_gemm_fn fn, const void *w, size_t stride, int rows, int k, const void *act, size_t ab,
                   int n_tok, float *out, int nth) {
    const int ng = (rows + 15) / 16;
    gemm_job j[16];
    pthread_t th[16];
    const double t0 = time_now();
    for (int i = 0; i < nth; i++) {
        const int g0 = (int)((long)ng * i / nth), g1 = (int)((long)ng * (i + 1) / nth);
        j[i] = (gemm_job){fn, w, stride, g0 * 16, DT_MIN(g1 * 16, rows), k, act, ab, n_tok, out, (size_t)rows};
        if (i) pthread_create(&th[i], NULL, gemm_job_run, &j[i]);
    }
    gemm_job_run(&j[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    return time_now() - t0;
}

typedef struct {
    uint32_t type;
    const void *src;
    size_t rb;
    int rows, k;
    void *dst;
    int g0, g1;
} rjob;
static void *run_repack(void *p) {
    rjob *j = p;
    repack_rows(j->type, j->src, j->rb, j->rows, j->k, j->dst, j->g0, j->g1);
    return NULL;
}

/* ---- real weights ---------------------------------------------------------------------------- */

static int gguf_mode(const char *path, const char *which, int reps) {
    gguf_file *f;
    ditto_err err;
    if (gguf_open(&f, path, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    char prefix[128];
    if (which[0] >= '0' && which[0] <= '9') snprintf(prefix, sizeof prefix, "blk.%d.", atoi(which));
    else snprintf(prefix, sizeof prefix, "%s", which);
    printf("%-28s %-5s %5s %5s %4s | check | n_tok 1: row-major  repacked GB/s | n_tok 4: row-major  repacked GB/s\n",
           "tensor", "type", "rows", "k", "mats");
    int bad_total = 0;
    for (uint64_t ti = 0; ti < f->n_tensors; ti++) {
        const gguf_tensor *T = &f->tensors[ti];
        if (strncmp(T->name, prefix, strlen(prefix)) || !repack_supported(T->type)) continue;
        const int k = (int)T->ne[0], rows = (int)T->ne[1], nm = (int)(T->ne[2] * T->ne[3]);
        const quant_traits *tr = quant_traits_of(T->type);
        const size_t rb = quant_row_bytes(T->type, k), mb = (size_t)rows * rb;
        const size_t rpm = repack_bytes(T->type, rows, k), gb = repack_group_bytes(T->type, k);
        uint8_t *src = big_alloc(mb * (size_t)nm), *wp = big_alloc(rpm * (size_t)nm);
        memcpy(src, T->data, mb * (size_t)nm); /* private copy: page cache out of the timing */
        for (int m = 0; m < nm; m++)
            repack_rows(T->type, src + (size_t)m * mb, rb, rows, k, wp + (size_t)m * rpm, 0, (rows + 15) / 16);
        const size_t ab = quant_act_bytes(tr->act, k);
        uint8_t *act = xmalloc(ab * 8);
        float *xf = xmalloc((size_t)k * 4);
        for (int t = 0; t < 8; t++) {
            for (int i = 0; i < k; i++) xf[i] = (float)((int64_t)(xs() % 2001) - 1000) * 1e-3f;
            quant_act_row(tr->act, xf, act + (size_t)t * ab, k);
        }
        float *o1 = xmalloc((size_t)rows * 8 * 4), *o2 = xmalloc((size_t)rows * 8 * 4);
        /* bitwise check on a few matrices (all levels), then every matrix at avx512 n_tok 1 */
        int bad = 0;
        static const int NTS[3] = {1, 3, 8};
        for (int m = 0; m < nm; m++) {
            const int full = m < 2 || m == nm - 1;
            for (int ni = 0; ni < 3; ni++) {
                if (!full && ni) break;
                const int nt = NTS[ni];
                tr->gemm(src + (size_t)m * mb, rb, 0, rows, k, act, ab, nt, o1, (size_t)rows);
                for (int lv = full ? CPU_GENERIC : (int)cpu_level_hw(); lv <= (int)cpu_level_hw(); lv++) {
                    memset(o2, 0xFF, (size_t)rows * nt * 4);
                    repack_gemm(T->type, (enum cpu_level)lv, cpu_stream_detect())(wp + (size_t)m * rpm, gb, 0, rows, k,
                                                                                  act, ab, nt, o2,
                                                            (size_t)rows);
                    bad += memcmp(o1, o2, (size_t)rows * nt * 4) != 0;
                }
            }
        }
        bad_total += bad;
        /* timing: every matrix once per pass, as the MoE layer calls them */
        const quant_gemm_fn f_rm = cpu_quant_gemm(T->type, CPU_AVX512),
                            f_rp = repack_gemm(T->type, CPU_AVX512, cpu_stream_detect());
        double gbs[2][2];
        for (int ni = 0; ni < 2; ni++) {
            const int nt = ni ? 4 : 1;
            double best[2] = {1e9, 1e9};
            for (int r = 0; r < reps + 1; r++) {
                for (int kind = 0; kind < 2; kind++) {
                    const double t0 = time_now();
                    for (int m = 0; m < nm; m++) {
                        if (kind == 0) f_rm(src + (size_t)m * mb, rb, 0, rows, k, act, ab, nt, o1, (size_t)rows);
                        else f_rp(wp + (size_t)m * rpm, gb, 0, rows, k, act, ab, nt, o2, (size_t)rows);
                    }
                    const double dt = time_now() - t0;
                    if (r && dt < best[kind]) best[kind] = dt;
                }
            }
            for (int kind = 0; kind < 2; kind++) gbs[ni][kind] = (double)mb * nm / best[kind] / 1e9;
        }
        printf("%-28s %-5s %5d %5d %4d | %-5s | %17.2f %9.2f      | %17.2f %9.2f\n", T->name, tr->name, rows, k, nm,
               bad ? "FAIL" : "ok", gbs[0][0], gbs[0][1], gbs[1][0], gbs[1][1]);
        fflush(stdout);
        big_free(src, mb * (size_t)nm), big_free(wp, rpm * (size_t)nm);
        free(act), free(xf), free(o1), free(o2);
    }
    gguf_close(f);
    printf("%s\n", bad_total ? "BITWISE MISMATCHES" : "all repacked results bitwise equal to the reference");
    return bad_total != 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "gguf")) return gguf_mode(argv[2], argc > 3 ? argv[3] : "0", argc > 4 ? atoi(argv[4]) : 5);
    const double gib = argc > 1 ? atof(argv[1]) : 1.0;
    const int reps = argc > 2 ? atoi(argv[2]) : 5;
    const int maxth = argc > 3 ? DT_MIN(16, atoi(argv[3])) : 2;
    enum cpu_level lv = CPU_AVX512;
    if (argc > 4) lv = !strcmp(argv[4], "generic") ? CPU_GENERIC : !strcmp(argv[4], "avx2") ? CPU_AVX2 : CPU_AVX512;
    if (lv > cpu_level_hw()) lv = cpu_level_hw();
    const int k = argc > 8 ? atoi(argv[8]) : 2048;
    DT_ASSERT(k > 0 && k % QK32 == 0);
    int nts[16] = {1, 2, 4, 8, 16}, n_nts = 5;
    if (argc > 6) {
        n_nts = 0;
        for (char *p = argv[6]; *p && n_nts < 16;) {
            nts[n_nts++] = (int)strtol(p, &p, 10);
            if (*p == ',') p++;
            else break;
        }
    }
    const char *tsel = argc > 5 ? argv[5] : "q4_k,q6_k";
    g_huge = argc > 7 ? atoi(argv[7]) : 0;
    const uint32_t types[] = {QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q8_0};
    static const char *const tnames[] = {"q4_k", "q5_k", "q6_k", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"};
    printf("bench_repack: K=%d, >= %.2f GiB per matrix, best of %d, level %s%s\n", k, gib, reps, cpu_level_name(lv),
           g_huge ? ", huge pages" : "");
    printf("%-5s %5s %3s | %-22s | %-22s | %s\n", "type", "n_tok", "thr", "row-major GB/s GMAC/s", "repacked  GB/s GMAC/s",
           "speedup");
    for (int ti = 0; ti < 8; ti++) {
        const uint32_t type = types[ti];
        const quant_traits *tr = quant_traits_of(type);
        if (!strstr(tsel, tnames[ti]) || k % (int)tr->blck) continue;
        const size_t rb = quant_row_bytes(type, k);
        int rows = (int)((gib * 1073741824.0 + (double)rb - 1) / (double)rb);
        rows = (rows + 15) / 16 * 16;
        const size_t wbytes = (size_t)rows * rb;
        uint8_t *w = big_alloc(wbytes);
        uint64_t *w64 = (uint64_t *)(void *)w;
        for (size_t i = 0; i < wbytes / 8; i++) w64[i] = xs();
        for (size_t b = 0; b < wbytes / tr->bytes; b++) { /* sane fp16 scales: |d| in [2^-12, 2^-4) */
            uint8_t *blk = w + b * tr->bytes;
            const uint16_t d = (uint16_t)((xs() & 0x8000) | ((3 + xs() % 8) << 10) | (xs() & 0x3FF));
            const uint16_t dm = (uint16_t)(((3 + xs() % 8) << 10) | (xs() & 0x3FF));
            if (type == QT_Q4_K || type == QT_Q5_K) {
                memcpy(blk, &d, 2);
                memcpy(blk + 2, &dm, 2);
            } else if (type != QT_Q6_K) { /* the 32-weight blocks: d first (Q4_1 / Q5_1: m next) */
                memcpy(blk, &d, 2);
                if (type == QT_Q4_1 || type == QT_Q5_1) memcpy(blk + 2, &dm, 2);
            } else {
                memcpy(blk + 208, &d, 2);
            }
        }
        const size_t rpb = repack_bytes(type, rows, k), gb = repack_group_bytes(type, k);
        uint8_t *wp = big_alloc(rpb);
        /* repack in parallel, as a loader would (into already-touched pages) */
        {
            const int ng = rows / 16;
            rjob j[16];
            pthread_t th[16];
            const double t0 = time_now();
            for (int i = 0; i < maxth; i++) {
                j[i] = (rjob){type, w, rb, rows, k, wp, (int)((long)ng * i / maxth), (int)((long)ng * (i + 1) / maxth)};
                pthread_create(&th[i], NULL, run_repack, &j[i]);
            }
            for (int i = 0; i < maxth; i++) pthread_join(th[i], NULL);
            const double dt = time_now() - t0;
            printf("%s: %d rows x %d, %.3f GiB (repacked %.3f GiB); repack_rows with %d threads: %.2f s (%.2f GB/s)\n",
                   tr->name, rows, k, (double)wbytes / 1073741824.0, (double)rpb / 1073741824.0, maxth, dt,
                   (double)wbytes / dt / 1e9);
        }
        const size_t ab = quant_act_bytes(tr->act, k);
        uint8_t *act = xmalloc(ab * 64);
        float *xf = xmalloc((size_t)k * 4);
        for (int t = 0; t < 16; t++) {
            for (int i = 0; i < k; i++) xf[i] = (float)((int64_t)(xs() % 2001) - 1000) * 1e-3f;
            quant_act_row(tr->act, xf, act + (size_t)t * ab, k);
        }
        int maxnt = 1;
        for (int ni = 0; ni < n_nts; ni++) maxnt = DT_MAX(maxnt, nts[ni]);
        DT_ASSERT(maxnt <= 64);
        for (int t = 16; t < maxnt; t++) memcpy(act + (size_t)t * ab, act + (size_t)(t % 16) * ab, ab);
        float *o1 = xaligned((size_t)rows * maxnt * 4), *o2 = xaligned((size_t)rows * maxnt * 4);
        const quant_gemm_fn f_rm = cpu_quant_gemm(type, lv), f_rp = repack_gemm(type, lv, cpu_stream_detect());
        for (int ni = 0; ni < n_nts; ni++) {
            const int nt = nts[ni];
            for (int th = 1; th <= maxth; th++) {
                double best_rm = 1e9, best_rp = 1e9;
                for (int r = 0; r < reps; r++) { /* interleaved, so load spikes hit both */
                    const double a = pass(f_rm, w, rb, rows, k, act, ab, nt, o1, th);
                    const double b = pass(f_rp, wp, gb, rows, k, act, ab, nt, o2, th);
                    if (a < best_rm) best_rm = a;
                    if (b < best_rp) best_rp = b;
                }
                const int same = !memcmp(o1, o2, (size_t)rows * nt * 4);
                const double macs = (double)rows * k * nt;
                printf("%-5s %5d %3d | %8.2f %11.1f   | %8.2f %11.1f   | %5.2fx%s\n", tr->name, nt, th,
                       (double)wbytes / best_rm / 1e9, macs / best_rm / 1e9, (double)wbytes / best_rp / 1e9,
                       macs / best_rp / 1e9, best_rm / best_rp, same ? "" : "  OUTPUTS DIFFER");
                fflush(stdout);
            }
        }
        big_free(w, wbytes), big_free(wp, rpb);
        free(act), free(xf), free(o1), free(o2);
    }
    return 0;
}
