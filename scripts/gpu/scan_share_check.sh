#!/usr/bin/env bash
# Ninth session, one GPU: the scan routing's last block with a smaller share
# of the tokens (scan_last_block_share, dispatch_token_shares.h) against the
# base commit's even split (.ab_base/, `git archive REV | tar -x -C .ab_base`),
# on the one-GPU proxy with -DMOE_EP_DIAGNOSTICS builds, alternated twice:
# 1024-4096 tokens on 32 and 66 SMs (routed by scan by default); per-block
# phase times on 66 SMs (MOE_EP_DISPATCH_DIAGNOSTIC=4, dispatch_trace.py);
# then the release build: the NVLink dispatch suites, the conformance check
# with either routing, memcheck / racecheck / synccheck on the routing cases.
#   usage: OUT=/dir bash scripts/gpu/scan_share_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-400}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
ab_builds
for round in 1 2; do
  for v in base new; do
    for t in 1024 2048 4096; do
      for sms in 32 66; do ab_proxy $v "t${t}_sms${sms}_$round" $t $sms 5 30; done
    done
  done
done
for v in base new; do ab_proxy $v "trace_t4096_sms66" 4096 66 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
trace_summaries
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 150 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_lookback_np2 \
  nvlink_gpu_dispatch_bulk_general_np2
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nvlink_scan 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=0 -x MOE_EP_SMALL_BATCH=0 $TOOL check --backend nvlink
step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8 90 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step memcheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[routing],[bad_ids],[peer_counts]"
step racecheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[routing]"
step synccheck_routing 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[routing]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
