#!/usr/bin/env bash
# One short device call (2 GPUs): the whole-row pull with its accumulators
# started by the first partial (v21), with the default consumers and with
# MOE_EP_PULL_WIDE_CONSUMERS=1 (only the warps that cover the row with four
# vectors per thread), at 4096 tokens on 8, 16, 24 and all SMs (the call before:
# 273.6 / 192.9 / 192.2 / 191.5 us); correctness first: check
# --zero-copy-combine with both, the NVLink suites, memcheck and racecheck on
# [zero_copy] with both.
#   usage: OUT=/dir bash scripts/gpu/pull_wide_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-200}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 120 moe_ep_conformance test_nvlink_gpu
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
for wide in 0 1; do
  step "check_wide$wide" 40 $MPI2 -x MOE_EP_PULL_WIDE_CONSUMERS=$wide $TOOL check --backend nvlink --zero-copy-combine
done
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 10 -n 40 \
  --graph --zero-copy-combine --no-baselines"
for sms in 8 16 24 0; do
  for wide in 0 1; do
    NPICK=1 PICK="^ +4096 \|" step "pull_sms${sms}_wide$wide" 20 $MPI2 -x MOE_EP_PULL_WIDE_CONSUMERS=$wide \
      $TOOL $B --num-sms $sms
  done
done
nvlink_suites 40 nvlink_gpu_np2 nvlink_gpu_dispatch_bulk_np2 nvlink_gpu_dispatch_bulk_general_np2
for wide in 0 1; do
  step "memcheck_wide$wide" 40 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_WIDE_CONSUMERS=$wide $SAN --tool memcheck \
    $GPU_TEST "[zero_copy]"
  step "racecheck_wide$wide" 40 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_WIDE_CONSUMERS=$wide $SAN --tool racecheck \
    $GPU_TEST "[zero_copy]"
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
