#!/usr/bin/env bash
# Eighth session's validation on ONE GPU (nvidia-h200; the two-GPU machines
# were withheld): final_session7.sh (every GPU CTest suite that runs on one
# GPU, the conformance check on 2 and 4 ranks, zero-copy and 8 SMs, the fd
# exchange as root, compute-sanitizer memcheck / racecheck / synccheck, the
# proxy at 8 / 16 / 24 SMs), then memcheck and racecheck on the new routing
# cases, and a -DMOE_EP_DIAGNOSTICS build's per-block phase times on the
# one-GPU proxy at 512 and 4096 tokens (dispatch_trace.py; summary_trace.txt).
#   usage: OUT=/dir bash scripts/gpu/final_session8.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET_ALL=${1:-560}
here=$(dirname "$0")
OUT=$OUT bash "$here/final_session7.sh" $((BUDGET_ALL - 90))
first=$?
BUDGET=90
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary_trace.txt
STEP_LOG_DIR=$OUT/trace_steps
mkdir -p "$STEP_LOG_DIR"
source "$here/steps.sh"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
MPI2="mpirun -np 2 --bind-to none"
step memcheck_routing 40 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $BUILD/test/nvlink/test_nvlink_gpu "[routing]"
step racecheck_routing 40 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $BUILD/test/nvlink/test_nvlink_gpu "[routing]"
diag_proxy diag "$PWD"
for run in "512 66" "4096 66" "4096 24" "4096 16" "4096 8"; do
  set -- $run
  NPICK=1 PICK="^proxy" step "trace_t$1_sms$2" 20 env MOE_EP_DISPATCH_DIAGNOSTIC=4 /tmp/proxy_diag "$1" "$2" 3 1
done
for f in "$STEP_LOG_DIR"/trace_*.log; do
  { echo "== $(basename "$f" .log)"; python3 "$here/dispatch_trace.py" "$f"; } >> "$SUMMARY"
done
cat "$SUMMARY"
[ "$first" -eq 0 ] && exit $rc || exit 1
