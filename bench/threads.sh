#!/bin/sh
# bench/threads.sh MODEL "T1 T2 ..." [STEPS=16] — one stream's greedy decode at each thread count: its logits
# hashes at every step against the first count's (the contract: the same bits at any thread count) and the
# decode rate `ditto run` reports. Exits 1 if any count's hashes differ. DITTO=path overrides ./ditto.
set -eu
M=$1
COUNTS=$2
STEPS=${3:-16}
DITTO=${DITTO:-./ditto}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PROMPT=9707,11,1879,374,264,1273,315,279,1849,13,576,3974,13876,38835
first=
bad=0
printf '| threads | steps | logits hashes = %s | prefill tok/s | decode tok/s |\n|---:|---:|---|---:|---:|\n' \
    "first count's"
for t in $COUNTS; do
    "$DITTO" run -m "$M" --prompt-ids $PROMPT -n "$STEPS" --threads "$t" --logits-hash >"$T/out.$t" 2>&1
    grep -o 'logits [0-9a-f]*' "$T/out.$t" >"$T/hash.$t"
    n=$(wc -l <"$T/hash.$t")
    if [ -z "$first" ]; then
        first=$t
        same="(reference)"
    elif cmp -s "$T/hash.$first" "$T/hash.$t"; then
        same=yes
    else
        same="**no**"
        bad=1
    fi
    [ "$n" -eq "$STEPS" ] || { same="**$n of $STEPS steps**"; bad=1; }
    pre=$(sed -n 's/.*prefill: [^(]*(\([0-9.]*\) tok\/s).*/\1/p' "$T/out.$t")
    dec=$(sed -n 's/.*decode: [^(]*(\([0-9.]*\) tok\/s).*/\1/p' "$T/out.$t")
    printf '| %s | %s | %s | %s | %s |\n' "$t" "$n" "$same" "$pre" "$dec"
done
sed -n 's/.*\[\(cpu .*\)\]$/backend (last count): \1/p' "$T/out.$t"
exit $bad
