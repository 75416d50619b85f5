#!/bin/sh
# bench/ab.sh — A/B of two commits with `ditto bench`, runs alternating (A B A B ...), so the
# shared machine's drift hits both sides alike; prints each run's rows and per-stage profile,
# labelled, then the medians of each side's aggregate tok/s per row and of its prefill rate.
#
#   bench/ab.sh REV_A REV_B [RUNS=2] -- BENCH_ARGS...
#   bench/ab.sh HEAD~1 HEAD 3 -- -m /tmp/q12.gguf --streams 1,6,16 --prompt-len 128 --gen-len 32 --threads 2
#
# REV may be WORK for the working tree as it is. Each commit is built in a worktree under
# ${AB_DIR:-/tmp/ditto-ab}/<sha> (kept between calls; `git worktree remove DIR` drops one).
# --profile is added to the bench args.
set -eu
[ $# -ge 3 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
A=$1 B=$2; shift 2
RUNS=2
if [ "$1" != "--" ]; then RUNS=$1; shift; fi
[ "$1" = "--" ] || { echo "ab.sh: expected -- before the bench arguments" >&2; exit 2; }
shift
ROOT=$(git rev-parse --show-toplevel)
DIR=${AB_DIR:-/tmp/ditto-ab}
mkdir -p "$DIR"

build() { # REV -> prints the path of its ditto binary
    if [ "$1" = WORK ]; then
        make -C "$ROOT" -s >&2 && echo "$ROOT/ditto"
        return
    fi
    sha=$(git -C "$ROOT" rev-parse --short "$1")
    wt=$DIR/$sha
    [ -d "$wt" ] || git -C "$ROOT" worktree add -f -q --detach "$wt" "$sha" >&2
    make -C "$wt" -s >&2 && echo "$wt/ditto"
}
BA=$(build "$A")
BB=$(build "$B")
OUT=$(mktemp)
i=0
while [ $i -lt "$RUNS" ]; do
    for side in A B; do
        if [ $side = A ]; then bin=$BA; rev=$A; else bin=$BB; rev=$B; fi
        echo "## run $((i + 1)) $side ($rev)"
        # the bench finds the default model relative to the current directory
        (cd "$ROOT" && "$bin" bench "$@" --profile) | grep -E '^\| |^paired|^  median|^prefill|^cpu:' | grep -v -- '---' | tee -a "$OUT.$side"
    done
    i=$((i + 1))
done
echo "## medians of aggregate tok/s per row (A = $A, B = $B)"
for side in A B; do
    # rows of the main table only: 11 columns, a stream count first
    awk -F'|' -v side=$side 'NF == 13 && $2 ~ /^ *[0-9]+ *$/ { key = $2 "|" $3; v[key] = v[key] " " $5 }
        END { for (k in v) { n = split(v[k], a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
              if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
              m = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2; printf "%s %s: %.2f tok/s (%d runs)\n", side, k, m, n } }' "$OUT.$side" | sort
    # "prefill: P tokens in S s = R tok/s ..."
    awk -v side=$side '/^prefill:/ { for (i = 1; i < NF; i++) if ($i == "=") v = v " " $(i + 1) }
        END { n = split(v, a, " "); if (!n) exit; for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
              if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
              printf "%s prefill: %.1f tok/s median (%s)\n", side, n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, v }' "$OUT.$side"
done
rm -f "$OUT" "$OUT.A" "$OUT.B"
