#!/bin/sh
# Runs each test binary, prints its output, sums the "N passed, N failed" lines.
BUILD=${BUILD:-build}
pass=0; fail=0
for t in "$BUILD"/tests/test_*; do
    name=$(basename "$t")
    if [ $# -gt 0 ]; then
        hit=0; for f in "$@"; do case "$name" in *"$f"*) hit=1;; esac; done
        [ $hit = 1 ] || continue
    fi
    echo "== $name"
    start=$(date +%s)
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | tail -n 40
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    if [ -z "$line" ]; then
        echo "   ($name printed no summary, exit $rc: counted as 1 failure)"; fail=$((fail+1)); continue
    fi
    p=$(echo "$line" | cut -d' ' -f1); f=$(echo "$line" | cut -d' ' -f3)
    [ $rc -ne 0 ] && [ "$f" = 0 ] && f=1
    pass=$((pass+p)); fail=$((fail+f))
    echo "   ($(( $(date +%s) - start ))s)"
done
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
