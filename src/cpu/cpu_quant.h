/* cpu_quant.h — run-time choice of the SIMD gemm / activation-quantization kernels.
 *
 * Every kernel here is bitwise equal to the scalar reference in quant.c (the
 * `_generic` gemms and quant_act_row): the integer block sums are exact in any
 * order, and the fp32 chain per (row, token) is the reference's, op for op, with
 * SIMD lanes = output rows (docs/arithmetic.md). tests/test_quant.c proves it.
 *
 * Levels: CPU_AVX2 needs AVX2+FMA+F16C; CPU_AVX512 needs AVX-512 F/BW/VL/DQ and
 * VNNI (and the OS saving the zmm/opmask state). The gemm kernels assume
 * activations made by quant_act_row / cpu_quant_act_row (|q| <= 127, block_q8a.s
 * and block_q8k.bsums equal to the sums of q). */
#ifndef DITTO_CPU_QUANT_H
#define DITTO_CPU_QUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "quant.h"

enum cpu_level { CPU_GENERIC = 0, CPU_AVX2 = 1, CPU_AVX512 = 2 };

/* How the one-token kernels stream a weight matrix (cpu/prefetch.h has the forms and what each
 * read where): the same results in every form, a different order of memory requests. */
enum cpu_stream { CPU_STREAM_NEAR_FAR = 0, CPU_STREAM_TWO_L1 = 1, CPU_STREAM_PLAIN = 2, CPU_STREAM_TOUCH = 3, CPU_STREAM_COUNT };

/* Whether form f makes no software prefetch requests (CPU_STREAM_PLAIN, and CPU_STREAM_TOUCH,
 * which is plain with each Q4_K / Q5_K weight line first read by a 256-bit load). */
static inline bool cpu_stream_no_requests(int f) { return f == CPU_STREAM_PLAIN || f == CPU_STREAM_TOUCH; }

/* The form for this host's AVX-512 kernels: env DITTO_CPU_STREAM=near-far|two-l1|plain|touch if set
 * (anything else is ignored), else CPU_STREAM_TWO_L1 on AMD family 0x1A (Zen 5) and later,
 * CPU_STREAM_TOUCH on family 0x19 (Zen 4), where each was measured faster, and
 * CPU_STREAM_NEAR_FAR elsewhere. */
enum cpu_stream cpu_stream_detect(void);
/* The form the kernels of `level` run: `want` (enum cpu_stream) or, if negative, this host's.
 * At AVX-512 (level and hardware) any form. At AVX2, whose one-token kernels have two forms
 * (their own requests into L2, or none), CPU_STREAM_PLAIN where `want` or DITTO_CPU_STREAM says
 * plain or touch (their weight vectors are 256-bit loads already), else CPU_STREAM_NEAR_FAR on
 * every host: on the Zen 4 host, whose AVX-512 form was plain then, the AVX2 kernels' solo steps
 * read 1.25x plain's with their requests into L2 (bench/cpu-speed-log.md, twenty-ninth session).
 * Below AVX2, CPU_STREAM_NEAR_FAR. */
enum cpu_stream cpu_stream_select(enum cpu_level level, int want);
const char *cpu_stream_name(enum cpu_stream form);
/* The form named name (as cpu_stream_name spells it), or -1 (name NULL or unknown). */
int cpu_stream_parse(const char *name);

/* Best level this CPU (and OS) supports; env DITTO_CPU=generic|avx2|avx512 can lower it
 * (never raise it). */
enum cpu_level cpu_level_detect(void);
/* Best level of the hardware alone, ignoring DITTO_CPU (cached). */
enum cpu_level cpu_level_hw(void);
/* Whether the AVX2 level's repacked kernels run in their AVX-VNNI build (repack_avx2vnni.c):
 * the CPU has AVX-VNNI (CPUID 7.1 EAX bit 4) and env DITTO_AVXVNNI is not "0" (cached). */
bool cpu_avx_vnni(void);
const char *cpu_level_name(enum cpu_level level);

/* The gemm for a type at a level: falls back to the next lower level's kernel (finally
 * quant_traits_of(type)->gemm) where a level lacks one. A level above cpu_level_hw() is
 * lowered to it. NULL for a type without a gemm. */
quant_gemm_fn cpu_quant_gemm(uint32_t type, enum cpu_level level);
/* The same for the one-token stream form `form` (enum cpu_stream; which rows a call takes at
 * once, never their bits): at AVX-512 the float types' one-token calls take one row at a time in
 * the forms without requests (one stream a thread, as the repacked kernels), in two-l1 a row of
 * each half of the call's rows (two streams a thread, as the repacked kernels), four consecutive
 * rows in near-far. */
quant_gemm_fn cpu_quant_gemm_form(uint32_t type, enum cpu_level level, enum cpu_stream form);

/* Activation quantization row, SIMD where available, bitwise equal to quant_act_row. */
void cpu_quant_act_row(enum quant_act act, const float *x, void *dst, int64_t k,
                       enum cpu_level level);

/* ---- per-level tables (quant_avx2.c, quant_avx512.c); call only at a supported level */
quant_gemm_fn quant_gemm_avx2(uint32_t type);   /* NULL where the level has no kernel */
quant_gemm_fn quant_gemm_avx512(uint32_t type); /* NULL where the level has no kernel */
/* float types' kernels whose one-token calls follow `form` (cpu_quant_gemm_form); NULL for
 * other types and for near-far (quant_gemm_avx512's) */
quant_gemm_fn quant_gemm_avx512_form(uint32_t type, enum cpu_stream form);
void quant_act_row_avx2(enum quant_act act, const float *x, void *dst, int64_t k);
void quant_act_row_avx512(enum quant_act act, const float *x, void *dst, int64_t k);

/* For the row-major SIMD kernels: pointers to the rg rows of a group starting at row g,
 * of which nr are real; rows past nr repeat the last one (their results are not stored). */
static inline void cpu_quant_group_rows(const void *w, size_t row_bytes, int g, int nr, int rg, const uint8_t **rp) {
    for (int i = 0; i < rg; i++) rp[i] = (const uint8_t *)w + (size_t)(g + (i < nr ? i : nr - 1)) * row_bytes;
}

#endif
