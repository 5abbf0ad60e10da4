#!/usr/bin/env bash
# Ninth session's validation of main on ONE GPU (nvidia-h200; the two-GPU
# machines were withheld): build everything; every GPU CTest suite that runs on
# one GPU (the NVLink ones run several ranks on it; NCCL refuses two ranks on
# one GPU, so its suites are left for a two-GPU machine); the conformance check
# on the NVLink backend (2 and 4 ranks, zero-copy, 8 SMs, the dispatch
# look-back forced); the fd exchange as root; compute-sanitizer memcheck,
# racecheck and synccheck on the NVLink kernels, the routing cases with either
# routing; the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp): 4096 tokens on
# 8-24 SMs, and where the look-back starts to pay (1024 and 2048 tokens, auto /
# scan / look-back; SWEEP=0 leaves that out).
#   usage: OUT=/dir [SWEEP=0] bash scripts/gpu/final_session9.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
build_step 240
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
proxy_build "$PWD/$BUILD" /tmp/proxy > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
for sms in 8 16 24 32 66; do
  NPICK=1 PICK="^proxy" step "proxy_sms$sms" 30 /tmp/proxy 4096 $sms 5 30
done
for round in $([ "${SWEEP:-1}" = 0 ] || echo 1 2); do
  for t in 1024 2048; do
    for sms in 16 32 66; do
      for mode in auto 0 1; do
        NPICK=1 PICK="^proxy" step "proxy_t${t}_sms${sms}_${mode}_$round" 30 \
          env MOE_EP_DISPATCH_LOOKBACK=$mode /tmp/proxy $t $sms 5 30
      done
    done
  done
done
TOOL="$BUILD/tools/moe_ep_conformance"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
one_gpu_suites 150
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nvlink_zero_copy 90 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8 90 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
step check_nvlink_look 90 $MPI2 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 $TOOL check --backend nvlink
step fd_exchange_root 30 $BUILD/test/nvlink/test_nvlink_host "[fd_exchange]"
step memcheck_nvlink 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[peer_counts],[bad_ids],[zero_copy],[routing]"
step racecheck_nvlink 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[peer_counts],[zero_copy],[routing]"
step synccheck_nvlink 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[peer_counts],[zero_copy],[routing]"
step memcheck_look 120 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 \
  $SAN --tool memcheck $GPU_TEST "[peer_counts],[bad_ids],[routing]"
step racecheck_look 150 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0 \
  $SAN --tool racecheck $GPU_TEST "[peer_counts],[routing]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
