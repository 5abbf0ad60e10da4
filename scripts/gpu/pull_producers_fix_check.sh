#!/usr/bin/env bash
# One short device call (2 GPUs) after the fix of the whole-row pull with 3 or
# 4 producer warps (consumers with three vectors per thread for rows that need
# fewer read and wrote past the row: found by nvlink_gpu_dispatch_bulk_np2):
# every NVLink GPU suite (1, 2 and 4 producers among them), check
# --zero-copy-combine with 1, 3 and 4 producers, compute-sanitizer memcheck
# and racecheck on [zero_copy] with 4, 3 and 1 producers.
#   usage: OUT=/dir bash scripts/gpu/pull_producers_fix_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-240}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep_conformance test_nvlink_gpu moe_ep_kill_peer_probe test_float_convert
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
nvlink_suites 60 $(cd $BUILD && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: \(nvlink_gpu[a-z0-9_]*\)$/\1/p')
for producers in 1 3 4; do
  step "check_pull_p$producers" 60 $MPI2 -x MOE_EP_PULL_PRODUCERS=$producers $TOOL check --backend nvlink --zero-copy-combine
done
for producers in 4 3 1; do
  step "memcheck_pull_p$producers" 60 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_PRODUCERS=$producers $SAN --tool memcheck \
    $GPU_TEST "[zero_copy]"
done
step racecheck_pull_p4 60 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_PRODUCERS=4 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
