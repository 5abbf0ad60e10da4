#!/usr/bin/env bash
# A session's first device call (2 GPUs): scripts/gpu/session_validation.sh on
# the tree as it is (every GPU suite, check on both backends, the sanitizers,
# including the zero-copy pull), then scripts/gpu/pull_producers_check.sh (the
# whole-row pull with several producer warps, not yet measured) on the same
# build.  Profile with scripts/gpu/pull_profile.sh where a kernel needs it.
#   usage: OUT=/dir bash scripts/gpu/session_start.sh [VALIDATION_BUDGET_S] [PRODUCERS_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/validation" "$OUT/producers"
OUT=$OUT/validation bash "$(dirname "$0")/session_validation.sh" "${1:-360}" > /tmp/validation_stdout.txt 2>&1
v=$?
OUT=$OUT/producers bash "$(dirname "$0")/pull_producers_check.sh" "${2:-120}" > /tmp/producers_stdout.txt 2>&1
p=$?
echo "session_validation exit $v; pull_producers_check exit $p"
cat "$OUT/validation/summary.txt" "$OUT/producers/summary.txt"
[ "$v" -eq 0 ] && [ "$p" -eq 0 ]
