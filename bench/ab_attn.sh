#!/bin/sh
# bench/ab_attn.sh — in-process A/B of two versions of src/cpu/attn_avx512.c (the AVX-512 attention
# over a GQA group): both are compiled into one bench/ab_attn.c binary, timed alternately on the same
# hot arena, and B's output is checked bitwise against A's.
#
#   bench/ab_attn.sh REV_A REV_B [HEADS_PER_KV=8] [HEAD_DIM=128] [N=2000]
#   bench/ab_attn.sh HEAD~1 HEAD 8 128 500
#
# REV may be WORK for the working tree's file. Both sides compile against the working tree's headers
# and link its build/libditto.a.
set -eu
[ $# -ge 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
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
for side in A B; do
    rev=$A
    [ $side = B ] && rev=$B
    if [ "$rev" = WORK ]; then cp src/cpu/attn_avx512.c "$T/$side.c"
    else git show "$rev:src/cpu/attn_avx512.c" > "$T/$side.c"; fi
    # shellcheck disable=SC2086
    $CC $FLAGS -iquote src/cpu -Dattn_group_avx512=attn_group_avx512_$side -c -o "$T/$side.o" "$T/$side.c"
done
# shellcheck disable=SC2086
$CC $FLAGS -o "$T/ab_attn" bench/ab_attn.c "$T/A.o" "$T/B.o" build/libditto.a -lm -pthread
echo "A = $A, B = $B"
"$T/ab_attn" "$@"
