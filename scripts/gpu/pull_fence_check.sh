#!/usr/bin/env bash
# The whole-row pull with and without the proxy fence before each bulk copy
# (MOE_EP_PULL_PROXY_FENCE), on 8, 16, 24 SMs and all, 512 and 4096 tokens,
# DeepSeek shape, graph, --zero-copy-combine; plus the np2 suite and racecheck
# on [zero_copy] without the fence.  Expects a build in $BUILD.
#   usage: OUT=/dir BUILD=build-final bash scripts/gpu/pull_fence_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-90}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step np2_no_fence 30 mpirun -np 2 --bind-to none -x MOE_EP_PULL_PROXY_FENCE=0 $GPU_TEST
step racecheck_no_fence 40 mpirun -np 2 --bind-to none -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_PROXY_FENCE=0 \
  compute-sanitizer --print-limit 4 --error-exitcode 3 --tool racecheck $GPU_TEST "[zero_copy]"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --zero-copy-combine --no-baselines -t 512,4096"
for sms in 16 8 24 0; do
  for fence in 1 0; do
    NPICK=2 PICK="^ +[0-9]+ \|" step "fence${fence}_sms$sms" 20 mpirun -np 2 --bind-to none -x MOE_EP_PULL_PROXY_FENCE=$fence $TOOL $B --num-sms $sms
  done
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
