#!/usr/bin/env bash
# A session's first device call (2 GPUs): scripts/gpu/session_validation.sh on
# the tree as it is (every GPU suite, check on both backends, the sanitizers,
# including the zero-copy pull), then scripts/gpu/pull_profile.sh (Nsight
# Compute on rank 0's pull kernel at 16 SMs) on the same build.
#   usage: OUT=/dir bash scripts/gpu/session_start.sh [VALIDATION_BUDGET_S] [PROFILE_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT/validation" "$OUT/profile"
OUT=$OUT/validation bash "$(dirname "$0")/session_validation.sh" "${1:-360}" > /tmp/validation_stdout.txt 2>&1
v=$?
OUT=$OUT/profile bash "$(dirname "$0")/pull_profile.sh" "${2:-160}" > /tmp/profile_stdout.txt 2>&1
p=$?
echo "session_validation exit $v; pull_profile exit $p"
cat "$OUT/validation/summary.txt" "$OUT/profile/summary.txt"
[ "$v" -eq 0 ] && [ "$p" -eq 0 ]
