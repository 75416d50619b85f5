#!/bin/sh
# bench/ab_kernel.sh — in-process A/B of two versions of src/cpu/repack_avx512.c (the AVX-512
# repacked Q4_K / Q6_K gemm kernels): both are compiled into one bench/ab_kernel.c binary and
# timed alternately on the same data, so the VM's drift hits both alike (see ab_kernel.c).
# With --attn, of src/cpu/attn_avx512.c instead, in bench/bench_attn.c (hot arena, B checked
# bitwise against A); with --attn-cold, in bench/attn_cold.c (the arena cold, as a decode step
# finds it: two threads, layer after layer of the 30B-A3B geometry).
#
#   bench/ab_kernel.sh REV_A REV_B [ROWS=32] [NTOK=1,2,4,6,8] [TYPES=q4_k,q6_k; also q5_k, q4_0, q8_0] [THREADS=1] [NMAT=1]
#   bench/ab_kernel.sh HEAD~1 HEAD 400000 1 q4_k 2       # one token, from memory, two threads
#   bench/ab_kernel.sh HEAD~1 HEAD 1536 1 q4_k 2 300     # 300 expert-sized matrices in turn
#   AB_K=768 bench/ab_kernel.sh WORK WORK 2048 1 q4_k 2 300  # 300 down-projection-shaped ones (k 768)
#   bench/ab_kernel.sh --attn REV_A REV_B [HEADS_PER_KV=8] [HEAD_DIM=128] [N=2000]
#   bench/ab_kernel.sh --attn-cold REV_A REV_B CTX [ROUNDS=30]      # e.g. CTX 2048
#
# AB_LEVEL=avx2 A/Bs src/cpu/repack_avx2.c instead (AB_VNNI=1: its AVX-VNNI build), for hosts without AVX-512;
# with --attn / --attn-cold, src/cpu/attn_avx2.c.
# AB_ROUNDS=N sets the kernel A/B's rounds (it prints the best-of ratio and the median of the per-round ones).
# AB_LOADS=1 adds plain loads of the same bytes to every round and prints A and B against them beside the
# slower and the faster half of those loads' rounds (how much of the stream each kernel turns into speed).
# AB_LOADS=2 makes those loads the two-l1 form's pattern (two lockstep halves, 512-bit loads, each line requested 4 KiB ahead into L1).
# AB_STAGE=S runs NMAT matrices S at a time, each thread its own contiguous run of them whole, one barrier per S
# (S below THREADS leaves threads idle).
# AB_FORM_A / AB_FORM_B = near-far | two-l1 | plain | touch (revisions from b254c1f on) pick each side's one-token stream form (cpu/prefetch.h; at
# AVX2 plain or the requests), e.g.
# AB_FORM_B=two-l1 bench/ab_kernel.sh WORK WORK 400000 1 q4_k 2; a revision from before the forms has one (near-far).
# REV may be WORK for the working tree's file. CFLAGS_A / CFLAGS_B add flags to one side's compile,
# e.g. CFLAGS_B='-DCPU_PF_DIST=16384 -DCPU_PF_HINT=_MM_HINT_T1' (src/cpu/prefetch.h) with REV_A = REV_B.
# Both sides compile against the working tree's headers and link its build/libditto.a (rebuilt here if
# stale; the reference and the repack come from it), so a revision from before a layout change shows
# as NOT BITWISE EQUAL. K is 2048 unless AB_K sets it (a multiple of 256).
set -eu
ATTN=0
if [ "${1:-}" = --attn ]; then ATTN=1; shift; fi
if [ "${1:-}" = --attn-cold ]; then ATTN=2; shift; fi
[ $# -ge 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
A=$1 B=$2
shift 2
ROOT=$(git rev-parse --show-toplevel)
cd "$ROOT"
make -s build/libditto.a
CC=${CC:-cc}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
trap 'exit 130' INT TERM
FLAGS=$(make -s -f - print-avx512-flags <<'MK'
include Makefile
print-avx512-flags: ; @echo $(CFLAGS) $(AVX512_FLAGS)
MK
)
SRC=src/cpu/repack_avx512.c
AVX2=0
ATTN_LEVEL=avx512
if [ "${AB_LEVEL:-}" = avx2 ]; then
    FLAGS=$(make -s -f - print-avx2-flags <<'MK'
include Makefile
print-avx2-flags: ; @echo $(CFLAGS) $(AVX2_FLAGS)
MK
)
    if [ $ATTN = 0 ]; then
        AVX2=1
        SRC=src/cpu/repack_avx2.c
        [ "${AB_VNNI:-0}" = 1 ] && FLAGS="$FLAGS -mavxvnni -DRP_AVXVNNI"
    else
        ATTN_LEVEL=avx2
    fi
fi
[ $ATTN != 0 ] && SRC=src/cpu/attn_$ATTN_LEVEL.c
for side in A B; do
    rev=$A
    [ $side = B ] && rev=$B
    if [ "$rev" = WORK ]; then cp $SRC "$T/$side.c"
    else git show "$rev:$SRC" > "$T/$side.c"; fi
    # a revision from before the stream forms (c2a006d): its entry points take the form and ignore it
    if [ $AVX2 = 1 ]; then
        # ab_kernel.c calls repack_gemm_avx512_A / _B; the entry point takes the form (near-far or
        # plain) or, in a revision from before the AVX2 forms, the type only
        fn=repack_gemm_avx2
        [ "${AB_VNNI:-0}" = 1 ] && fn=repack_gemm_avx2vnni
        args='type, form'
        grep -q 'repack_gemm_avx2)(uint32_t type, enum cpu_stream form)' "$T/$side.c" ||
            sed -i 's/^\(quant_gemm_fn RP_NAME(repack_gemm_avx2)\|repack_gemm_next_fn RP_NAME(repack_gemm_next_avx2)\)(uint32_t type)/\1(uint32_t type, enum cpu_stream form __attribute__((unused)))/' "$T/$side.c"
        printf '\nquant_gemm_fn repack_gemm_avx512_%s(uint32_t type, enum cpu_stream form) { (void)form; return %s(%s); }\n' \
            "$side" "$fn" "$args" >> "$T/$side.c"
    elif [ $ATTN = 0 ] && ! grep -q 'enum cpu_stream form' "$T/$side.c"; then
        sed -i 's/^\(quant_gemm_fn repack_gemm_avx512\|repack_gemm_next_fn repack_gemm_next_avx512\)(uint32_t type)/\1(uint32_t type, enum cpu_stream form __attribute__((unused)))/' "$T/$side.c"
    fi
    extra=${CFLAGS_A:-}
    [ $side = B ] && extra=${CFLAGS_B:-}
    # the harnesses call attn_group_avx512_A / _B: at AB_LEVEL=avx2 those are the AVX2 attention's
    if [ $ATTN != 0 ]; then rename="-iquote src/cpu -Dattn_group_$ATTN_LEVEL=attn_group_avx512_$side"
    elif [ $AVX2 = 1 ]; then
        rename="-Drepack_gemm_avx2=repack_gemm_avx2_$side -Drepack_gemm_next_avx2=repack_gemm_next_avx2_$side"
        rename="$rename -Drepack_gemm_avx2vnni=repack_gemm_avx2vnni_$side -Drepack_gemm_next_avx2vnni=repack_gemm_next_avx2vnni_$side"
    else rename="-Drepack_gemm_avx512=repack_gemm_avx512_$side -Drepack_gemm_next_avx512=repack_gemm_next_avx512_$side"; fi
    # shellcheck disable=SC2086
    $CC $FLAGS $extra -Wno-unused-function $rename -c -o "$T/$side.o" "$T/$side.c"
done
echo "A = $A, B = $B"
if [ $ATTN = 2 ]; then
    # shellcheck disable=SC2086
    $CC $FLAGS -o "$T/attn_cold" bench/attn_cold.c "$T/A.o" "$T/B.o" build/libditto.a -lm -pthread
    "$T/attn_cold" "$@"
    exit 0
fi
if [ $ATTN = 1 ]; then
    # shellcheck disable=SC2086
    $CC $FLAGS -DBENCH_ATTN_AB -o "$T/ab_attn" bench/bench_attn.c "$T/A.o" "$T/B.o" build/libditto.a -lm -pthread
    "$T/ab_attn" "$@"
    exit 0
fi
ROWS=${1:-32} NTOK=${2:-1,2,4,6,8} TYPES=${3:-q4_k,q6_k} THREADS=${4:-1} NMAT=${5:-1}
# shellcheck disable=SC2086
$CC $FLAGS -o "$T/ab_kernel" bench/ab_kernel.c "$T/A.o" "$T/B.o" build/libditto.a -lm -pthread
for ty in $(echo "$TYPES" | tr , ' '); do
    for nt in $(echo "$NTOK" | tr , ' '); do "$T/ab_kernel" "$ROWS" "$nt" "$ty" "$THREADS" "${AB_K:-2048}" "$NMAT"; done
done
