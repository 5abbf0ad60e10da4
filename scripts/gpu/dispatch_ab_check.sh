#!/usr/bin/env bash
# One GPU: this tree's dispatch against the base commit's (.ab_base/, an
# export carried beside the checkout: `git archive REV | tar -x -C .ab_base`)
# on the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp), -DMOE_EP_DIAGNOSTICS
# builds, alternated twice: 4096 tokens on 8-66 SMs, 16-byte rows
# (PROXY_HIDDEN=8), 512 tokens; per-block phase times of both
# (MOE_EP_DISPATCH_DIAGNOSTIC=4, dispatch_trace.py); then the release build of
# this tree: the NVLink GPU suites that test dispatch, the conformance check on
# 2 and 4 ranks and on 8 SMs, memcheck, racecheck and synccheck on the routing
# cases.  (Eighth session: v25 against v24; the ninth used its own copies,
# dispatch_lookback_check.sh and scan_share_check.sh.)
#   usage: OUT=/dir bash scripts/gpu/dispatch_ab_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-480}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
ab_builds
for round in 1 2; do
  for v in base new; do
    for sms in 8 16 24 32 66; do ab_proxy $v "t4096_sms${sms}_$round" 4096 $sms 5 30; done
    ab_proxy $v "h8_t4096_sms66_$round" 4096 66 5 30 PROXY_HIDDEN=8
    ab_proxy $v "t512_sms32_$round" 512 32 5 50
  done
done
for v in base new; do
  for sms in 8 16 24; do ab_proxy $v "trace_t4096_sms$sms" 4096 $sms 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
done
trace_summaries
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_bulk_general_np2
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8 90 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step memcheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[routing],[bad_ids],[peer_counts]"
step racecheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[routing]"
step synccheck_routing 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[routing]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
