#!/usr/bin/env bash
# One device call (2 GPUs) for the whole-row pull combine (MOE_EP_PULL_ROWS):
# build; the NVLink GPU suites (np2: whole rows; overlapped: whole rows from
# the copy engines' staging; overlapped_phases: 2 KiB segments; general
# kernels: register loads); then bench, DeepSeek shape, graph,
# --zero-copy-combine, whole rows against segments on all, 16 and 8 SMs.
#   usage: OUT=/dir bash scripts/gpu/pull_rows_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-150}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 90 test_nvlink_gpu moe_ep_conformance
nvlink_suites 40 nvlink_gpu_np2 nvlink_gpu_overlapped_np2 nvlink_gpu_overlapped_phases_np2 nvlink_gpu_general_kernels_np2
TOOL=$BUILD/tools/moe_ep_conformance
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --no-baselines --zero-copy-combine"
for sms in 0 16 8; do
  NPICK=4 PICK="^ +[0-9]+ \|" step rows_sms$sms 20 mpirun -np 2 --bind-to none $TOOL $B -t 1,128,512,4096 --num-sms $sms
  NPICK=4 PICK="^ +[0-9]+ \|" step segments_sms$sms 20 mpirun -np 2 --bind-to none -x MOE_EP_PULL_ROWS=0 $TOOL $B -t 1,128,512,4096 --num-sms $sms
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
