#!/bin/sh
# bench/ab_kernel.sh — in-process A/B of two versions of src/cpu/repack_avx512.c (the AVX-512
# repacked Q4_K / Q6_K gemm kernels): both are compiled into one bench/ab_kernel.c binary and
# timed alternately on the same data, so the VM's drift hits both alike (see ab_kernel.c).
#
#   bench/ab_kernel.sh REV_A REV_B [ROWS=32] [NTOK=1,2,4,6,8] [TYPES=q4_k,q6_k] [THREADS=1] [NMAT=1]
#   bench/ab_kernel.sh HEAD~1 HEAD 400000 1 q4_k 2       # one token, from memory, two threads
#   bench/ab_kernel.sh HEAD~1 HEAD 1536 1 q4_k 2 300     # 300 expert-sized matrices in turn
#
# REV may be WORK for the working tree's file. CFLAGS_A / CFLAGS_B add flags to one side's compile,
# e.g. CFLAGS_B='-DCPU_PF_DIST=16384 -DCPU_PF_HINT=_MM_HINT_T1' (src/cpu/prefetch.h) with REV_A = REV_B. Both sides compile against the working tree's headers
# and link its build/libditto.a (rebuilt here if stale; the reference and the repack come from it), so
# a revision from before a layout change shows as NOT BITWISE EQUAL. K is 2048.
set -eu
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
A=$1 B=$2 ROWS=${3:-32} NTOK=${4:-1,2,4,6,8} TYPES=${5:-q4_k,q6_k} THREADS=${6:-1} NMAT=${7:-1}
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
for side in A B; do
    rev=$A
    [ $side = B ] && rev=$B
    if [ "$rev" = WORK ]; then cp src/cpu/repack_avx512.c "$T/$side.c"
    else git show "$rev:src/cpu/repack_avx512.c" > "$T/$side.c"; fi
    extra=${CFLAGS_A:-}
    [ $side = B ] && extra=${CFLAGS_B:-}
    # shellcheck disable=SC2086
    $CC $FLAGS $extra -Wno-unused-function -Drepack_gemm_avx512=repack_gemm_avx512_$side -Drepack_gemm_next_avx512=repack_gemm_next_avx512_$side -c -o "$T/$side.o" "$T/$side.c"
done
# shellcheck disable=SC2086
$CC $FLAGS -o "$T/ab_kernel" bench/ab_kernel.c "$T/A.o" "$T/B.o" build/libditto.a -lm -pthread
echo "A = $A, B = $B"
for ty in $(echo "$TYPES" | tr , ' '); do
    for nt in $(echo "$NTOK" | tr , ' '); do "$T/ab_kernel" "$ROWS" "$nt" "$ty" "$THREADS" 2048 "$NMAT"; done
done
