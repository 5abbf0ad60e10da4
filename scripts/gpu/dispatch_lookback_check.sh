#!/usr/bin/env bash
# Ninth session, one GPU: the dispatch look-back (v27) against the base
# commit's dispatch (.ab_base/, `git archive REV | tar -x -C .ab_base`) on the
# one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp), -DMOE_EP_DIAGNOSTICS
# builds, alternated twice: base, this tree by default (look-back beyond 512
# tokens), this tree with MOE_EP_DISPATCH_LOOKBACK=0 (every block scans the
# tokens up to its last) and =1; 4096 tokens on 8-66 SMs, 16-byte rows
# (PROXY_HIDDEN=8), 512 tokens; per-block phase times (MOE_EP_DISPATCH_DIAGNOSTIC=4,
# dispatch_trace.py); then the release build: the NVLink GPU suites that test
# dispatch (with the look-back forced on every call among them), the
# conformance check on 2 and 4 ranks and on 8 SMs with either routing,
# memcheck, racecheck and synccheck on the routing cases with either routing.
#   usage: OUT=/dir bash scripts/gpu/dispatch_lookback_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
ab_builds
proxy() {  # label binary name tokens sms warmup iters [env...]
  local label=$1 v=$2
  shift 2
  ab_proxy "$label:$v" "$@"
}
variant() {  # label: the binary and its environment
  case $1 in
    base) echo "base" ;;
    auto) echo "new" ;;
    scan) echo "new MOE_EP_DISPATCH_LOOKBACK=0" ;;
    look) echo "new MOE_EP_DISPATCH_LOOKBACK=1" ;;
  esac
}
for round in 1 2; do
  for label in base auto scan; do
    read -r v env <<< "$(variant $label)"
    for sms in 8 16 24 32 66; do proxy $label $v "t4096_sms${sms}_$round" 4096 $sms 5 30 $env; done
    proxy $label $v "h8_t4096_sms66_$round" 4096 66 5 30 PROXY_HIDDEN=8 $env
  done
  for label in base auto look; do
    read -r v env <<< "$(variant $label)"
    proxy $label $v "t512_sms32_$round" 512 32 5 50 $env
  done
done
for label in base auto; do
  read -r v env <<< "$(variant $label)"
  for sms in 8 24 66; do proxy $label $v "trace_t4096_sms$sms" 4096 $sms 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4 $env; done
done
trace_summaries
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_lookback_np2 \
  nvlink_gpu_dispatch_bulk_general_np2
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nvlink_look 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 $TOOL check --backend nvlink
step check_nvlink_4ranks_look 120 mpirun -np 4 --oversubscribe --bind-to none -x MOE_EP_DISPATCH_LOOKBACK=1 \
  -x MOE_EP_SMALL_BATCH=0 $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8_look 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=1 $TOOL check --backend nvlink --num-sms 8
step check_nvlink_sms8_scan 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=0 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step memcheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[routing],[bad_ids],[peer_counts]"
step memcheck_routing_look 150 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 \
  $SAN --tool memcheck $GPU_TEST "[routing],[bad_ids],[peer_counts]"
step racecheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[routing]"
step synccheck_routing 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[routing]"
step racecheck_routing_scan 150 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=0 $SAN --tool racecheck $GPU_TEST "[routing]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
