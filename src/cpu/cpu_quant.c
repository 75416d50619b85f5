/* cpu_quant.c — CPU feature detection and the per-level kernel dispatch. */
#include "cpu/cpu_quant.h"

#include <cpuid.h>
#include <stdlib.h>
#include <string.h>

static uint64_t xgetbv0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static enum cpu_level detect_hw(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return CPU_GENERIC;
    const int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1,
              f16c = (c >> 29) & 1;
    if (!(osxsave && avx && fma && f16c)) return CPU_GENERIC;
    const uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 0x6) != 0x6) return CPU_GENERIC; /* XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return CPU_GENERIC;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx2 = (b >> 5) & 1;
    if (!avx2) return CPU_GENERIC;
    const int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1,
              vnni = (c >> 11) & 1;
    const int zmm_os = (xcr0 & 0xE0) == 0xE0; /* opmask, ZMM_Hi256, Hi16_ZMM */
    if (f && dq && bw && vl && vnni && zmm_os) return CPU_AVX512;
    return CPU_AVX2;
}

enum cpu_level cpu_level_hw(void) {
    static volatile int cached = -1; /* benign race: every thread computes the same value */
    int v = cached;
    if (v < 0) {
        v = (int)detect_hw();
        cached = v;
    }
    return (enum cpu_level)v;
}

bool cpu_avx_vnni(void) {
    static volatile int cached = -1; /* benign race, as cpu_level_hw's */
    int v = cached;
    if (v < 0) {
        unsigned a = 0, b, c, d;
        if (cpu_level_hw() >= CPU_AVX2 && __get_cpuid_max(0, NULL) >= 7) __cpuid_count(7, 1, a, b, c, d);
        const char *e = getenv("DITTO_AVXVNNI");
        v = ((a >> 4) & 1) && !(e && !strcmp(e, "0"));
        cached = v;
    }
    return v;
}

enum cpu_level cpu_level_detect(void) {
    enum cpu_level l = cpu_level_hw();
    const char *e = getenv("DITTO_CPU");
    if (e && *e) {
        enum cpu_level want = l;
        if (!strcmp(e, "generic")) want = CPU_GENERIC;
        else if (!strcmp(e, "avx2")) want = CPU_AVX2;
        else if (!strcmp(e, "avx512")) want = CPU_AVX512;
        if (want < l) l = want;
    }
    return l;
}

int cpu_stream_parse(const char *name) {
    for (int f = 0; name && f < CPU_STREAM_COUNT; f++)
        if (!strcmp(name, cpu_stream_name((enum cpu_stream)f))) return f;
    return -1;
}

/* The form DITTO_CPU_STREAM names, or -1. */
static int stream_env(void) {
    return cpu_stream_parse(getenv("DITTO_CPU_STREAM"));
}

enum cpu_stream cpu_stream_detect(void) {
    const int e = stream_env();
    if (e >= 0) return (enum cpu_stream)e;
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return CPU_STREAM_NEAR_FAR;
    const int amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return CPU_STREAM_NEAR_FAR;
    const unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
    return family >= 0x1a ? CPU_STREAM_TWO_L1 : family == 0x19 ? CPU_STREAM_TOUCH : CPU_STREAM_NEAR_FAR;
}

enum cpu_stream cpu_stream_select(enum cpu_level level, int want) {
    const enum cpu_level hw = cpu_level_hw();
    if (level >= CPU_AVX512 && hw >= CPU_AVX512) return want < 0 ? cpu_stream_detect() : (enum cpu_stream)want;
    if (level < CPU_AVX2 || hw < CPU_AVX2) return CPU_STREAM_NEAR_FAR;
    if (want < 0) want = stream_env();
    return cpu_stream_no_requests(want) ? CPU_STREAM_PLAIN : CPU_STREAM_NEAR_FAR;
}

const char *cpu_stream_name(enum cpu_stream form) {
    return form == CPU_STREAM_TWO_L1 ? "two-l1" : form == CPU_STREAM_PLAIN ? "plain" : form == CPU_STREAM_TOUCH ? "touch" : "near-far";
}

const char *cpu_level_name(enum cpu_level level) {
    switch (level) {
    case CPU_GENERIC: return "generic";
    case CPU_AVX2: return "avx2";
    case CPU_AVX512: return "avx512";
    }
    return "?";
}

static enum cpu_level clamp_level(enum cpu_level level) {
    enum cpu_level hw = cpu_level_hw();
    return level > hw ? hw : level;
}

quant_gemm_fn cpu_quant_gemm(uint32_t type, enum cpu_level level) {
    const quant_traits *t = quant_traits_of(type);
    if (!t || !t->supported) return NULL;
    level = clamp_level(level);
    quant_gemm_fn f = NULL;
    if (level >= CPU_AVX512) f = quant_gemm_avx512(type);
    if (!f && level >= CPU_AVX2) f = quant_gemm_avx2(type);
    return f ? f : t->gemm;
}

quant_gemm_fn cpu_quant_gemm_form(uint32_t type, enum cpu_level level, enum cpu_stream form) {
    const quant_gemm_fn f = cpu_quant_gemm(type, level);
    const quant_gemm_fn g = f && clamp_level(level) >= CPU_AVX512 ? quant_gemm_avx512_form(type, form) : NULL;
    return g ? g : f;
}

void cpu_quant_act_row(enum quant_act act, const float *x, void *dst, int64_t k,
                       enum cpu_level level) {
    level = clamp_level(level);
    if (level >= CPU_AVX512) quant_act_row_avx512(act, x, dst, k);
    else if (level >= CPU_AVX2) quant_act_row_avx2(act, x, dst, k);
    else quant_act_row(act, x, dst, k);
}
