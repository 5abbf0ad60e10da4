#!/usr/bin/env bash
# One device call (2 GPUs) for the copy-engine variant of the pull combine
# (MOE_EP_COMBINE_COPY_ENGINES): build everything; the NVLink GPU suites (the
# overlapped one runs the copy-engine variant in 3 chunks, the general-kernels
# one the register pull); compute-sanitizer memcheck and racecheck on the
# zero-copy cases with the copy engines; then bench, DeepSeek shape, 4096 tokens,
# graph, --zero-copy-combine: copy engines against the pull kernel on all, 24,
# 16 and 8 SMs, and 2 / 4 / 8 chunks on 16 SMs.
#   usage: OUT=/dir bash scripts/gpu/copy_engine_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/ce_summary.txt
source "$(dirname "$0")/steps.sh"
build_step 200
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
nvlink_suites 120 nvlink_gpu_np2 nvlink_gpu_overlapped_np2 nvlink_gpu_general_kernels_np2
step memcheck_ce 90 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_COMBINE_COPY_ENGINES=1 $SAN --tool memcheck $GPU_TEST "[zero_copy]"
step racecheck_ce 90 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_COMBINE_COPY_ENGINES=1 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --no-baselines --zero-copy-combine -t 4096"
for sms in 0 24 16 8; do
  step ce_sms$sms 30 $MPI2 -x MOE_EP_COMBINE_COPY_ENGINES=1 $TOOL $B --num-sms $sms
  step kernel_sms$sms 30 $MPI2 -x MOE_EP_COMBINE_COPY_ENGINES=0 $TOOL $B --num-sms $sms
done
for chunks in 2 8; do
  step ce_sms16_chunks$chunks 30 $MPI2 -x MOE_EP_COMBINE_COPY_ENGINES=1 -x MOE_EP_COMBINE_COPY_CHUNKS=$chunks $TOOL $B --num-sms 16
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
