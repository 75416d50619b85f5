#!/bin/sh
# bench/placement.sh [ROUNDS=150] [chop] — the two vCPUs' distance (a cache line's round trip) beside the
# machine's read rate, round by round; with chop, also the read rate of model-sized pieces (bench/placement.c).
set -eu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
D=$(dirname "$0")
${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -pthread -iquote "$D/../src" -o "$T/placement" "$D/placement.c"
"$T/placement" "${1:-150}" ${2:-}
