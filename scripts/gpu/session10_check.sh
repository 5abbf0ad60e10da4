#!/usr/bin/env bash
# Tenth session, one GPU: v29 (each look-back block counts its picks in shared
# memory and adds them to the global histogram once per expert) and the
# small-batch kernel's padding from the back, against the ninth session's
# final tree (.ab_base/ = `git archive 13541ba`) on the one-GPU proxy with
# -DMOE_EP_DIAGNOSTICS builds, alternated three times: 4096 tokens on 8-66
# SMs, 128 and 1 tokens (small-batch kernel); this tree's look-back and scan
# forced at 1024-4096 tokens on 32 and 66 SMs (the routing rule); per-block
# phase times (MOE_EP_DISPATCH_DIAGNOSTIC=4); then the release build: the
# NVLink GPU suites that test dispatch, the conformance check on 2 and 4 ranks
# and 8 SMs with either routing, memcheck / racecheck / synccheck on the
# routing and padding cases with either routing.
#   usage: OUT=/dir bash scripts/gpu/session10_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-560}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
ab_builds
for round in 1 2 3; do
  for v in base new; do
    for sms in 8 16 24 32 66; do ab_proxy $v "t4096_sms${sms}_$round" 4096 $sms 5 30; done
    ab_proxy $v "t128_sms66_$round" 128 66 10 100
    ab_proxy $v "t1_sms66_$round" 1 66 10 100
  done
done
for round in 1 2; do
  for t in 1024 2048 4096; do
    for sms in 32 66; do
      ab_proxy look:new "t${t}_sms${sms}_$round" $t $sms 5 30 MOE_EP_DISPATCH_LOOKBACK=1
      ab_proxy scan:new "t${t}_sms${sms}_$round" $t $sms 5 30 MOE_EP_DISPATCH_LOOKBACK=0
    done
  done
done
for v in base new; do
  for sms in 8 24; do ab_proxy $v "trace_t4096_sms$sms" 4096 $sms 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
done
ab_proxy look:new "trace_t4096_sms66" 4096 66 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4 MOE_EP_DISPATCH_LOOKBACK=1
trace_summaries
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_lookback_np2 \
  nvlink_gpu_dispatch_bulk_np2 nvlink_gpu_dispatch_bulk_general_np2
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nvlink_look 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 $TOOL check --backend nvlink
step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8_look 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=1 $TOOL check --backend nvlink --num-sms 8
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
CASES="[routing],[bad_ids],[peer_counts],token counts*"
step memcheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "$CASES"
step memcheck_routing_look 150 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 \
  $SAN --tool memcheck $GPU_TEST "$CASES"
step racecheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[routing],token counts*"
step racecheck_routing_look 150 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 \
  $SAN --tool racecheck $GPU_TEST "[routing],token counts*"
step synccheck_routing 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[routing],token counts*"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
