#!/usr/bin/env bash
# One device call (2 GPUs) for dispatch's bulk-copy rows (MOE_EP_DISPATCH_BULK,
# docs/nvlink_backend.md, v11), in order of what matters most if the budget
# runs out: build; the NVLink GPU suite with bulk rows (small-batch kernels);
# bench at 4096 tokens, DeepSeek shape, graph, on 8 / 16 / 24 / all SMs (all
# SMs also at 1, 128 and 512 tokens), register path against bulk copies, each
# pair back to back, baselines (C) in each run; compute-sanitizer
# memcheck, racecheck and synccheck on the dispatch-rows cases with bulk rows;
# the suite with bulk rows on the general kernels, the default suite, the
# general-kernels suite; then 20 / 28 / 32 SMs on both paths (the 24-SM dip).
# Writes $OUT/summary.txt (one line per step) and $OUT/logs.txt (everything).
#   usage: OUT=/dir bash scripts/gpu/dispatch_bulk_check.sh [BUDGET_S]   (default 240)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-240}
BUILD=${BUILD:-build-bulk}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 100 test_nvlink_gpu moe_ep_conformance
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"

step ctest_nvlink_gpu_dispatch_bulk_np2 45 ctest --test-dir $BUILD -R "^nvlink_gpu_dispatch_bulk_np2\$" --output-on-failure --timeout 40

# All SMs also at 1, 128 and 512 tokens: the bulk kernels' 192 KiB of shared memory must not cost small calls.
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 50 --graph"
for sms in 8 16 24 0; do
  sizes=4096 npick=2
  [ $sms -eq 0 ] && sizes=1,128,512,4096 npick=8
  NPICK=$npick PICK="^ +[0-9]+ \|" step registers_sms$sms 25 $MPI2 -x MOE_EP_DISPATCH_BULK=0 $TOOL $B -t $sizes --num-sms $sms
  NPICK=$npick PICK="^ +[0-9]+ \|" step bulk_sms$sms 25 $MPI2 -x MOE_EP_DISPATCH_BULK=1 $TOOL $B -t $sizes --num-sms $sms
done

for tool in memcheck racecheck synccheck; do
  step ${tool}_bulk 60 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_DISPATCH_BULK=1 $SAN --tool $tool $GPU_TEST "[dispatch_rows]"
done

for t in nvlink_gpu_dispatch_bulk_general_np2 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2; do
  step "ctest_$t" 45 ctest --test-dir $BUILD -R "^$t\$" --output-on-failure --timeout 40
done

for sms in 20 28 32; do
  NPICK=1 PICK="^ +[0-9]+ \|" step registers_sms$sms 20 $MPI2 -x MOE_EP_DISPATCH_BULK=0 $TOOL $B -t 4096 --no-baselines --num-sms $sms
  NPICK=1 PICK="^ +[0-9]+ \|" step bulk_sms$sms 20 $MPI2 -x MOE_EP_DISPATCH_BULK=1 $TOOL $B -t 4096 --no-baselines --num-sms $sms
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
