/* repack_avx2vnni.c — repack_avx2.c built for hosts with AVX-VNNI (VEX vpdpbusd on ymm, no
 * AVX-512): each sub-block's products summed in int32 lanes by vpdpbusd and scaled by vpmulld,
 * where the non-VNNI build needs vpmaddubsw, vpaddw and vpmaddwd; the same integers, so the same
 * bits (tests/test_repack.c runs both builds where the CPU has AVX-VNNI). */
#define RP_AVXVNNI 1
#include "cpu/repack_avx2.c"
