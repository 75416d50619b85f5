#!/bin/sh
# bench/placement.sh [ROUNDS=150] [chop] — the two vCPUs' distance (a cache line's round trip) beside the
# machine's read rate, round by round; with chop, also the read rate of model-sized pieces (bench/placement.c).
set -eu
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
${CC:-cc} -std=c11 -O2 -Wall -Wextra -Werror -pthread -o "$T/placement" "$(dirname "$0")/placement.c"
"$T/placement" "${1:-150}" ${2:-}
