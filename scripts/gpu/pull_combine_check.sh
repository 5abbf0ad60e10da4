#!/usr/bin/env bash
# One device call for the zero-copy pull combine (config.zero_copy_combine):
# build; the GPU suite's zero-copy cases and a few neighbours on the NVLink
# backend (2 ranks; on a one-GPU machine both ranks share the GPU); the
# conformance check's zero-copy cases; compute-sanitizer memcheck and
# racecheck on the zero-copy cases; then, where there are 2 GPUs, a bench of
# the copy path against the pull path (graph, DeepSeek shape, all SMs and 16).
#   usage: OUT=/dir bash scripts/gpu/pull_combine_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-400}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
GPUS=$(nvidia-smi -L | wc -l)
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo copy), $GPUS GPU(s)" | tee -a "$SUMMARY"
build_step 240
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none --oversubscribe"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
step suite_zero_copy 120 $MPI2 $GPU_TEST "[zero_copy],[graph],[peer_counts],[bad_ids]"
for t in nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_overlapped_np2 nvlink_gpu_general_kernels_np2; do
  step "ctest_$t" 150 ctest --test-dir $BUILD -R "^$t\$" --output-on-failure --timeout 140
done
step check_nvlink_zero_copy 90 $MPI2 $TOOL check --backend nvlink --filter zero_copy
step memcheck_zero_copy 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[zero_copy]"
step racecheck_zero_copy 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
step synccheck_zero_copy 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[zero_copy]"
step memcheck_pdl_kernels 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[peer_counts],[bad_ids]"
if [ "$GPUS" -ge 2 ]; then
  B="$TOOL bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -G --no-baselines -w 10 -n 50"
  for sms in 0 16; do
    NPICK=8 PICK="^ +[0-9]+ " step bench_copy_sms$sms 60 $MPI2 $B -t 1,128,512,4096 --num-sms $sms -J "$OUT/bench_copy_sms$sms.json"
    NPICK=8 PICK="^ +[0-9]+ " step bench_pull_sms$sms 60 $MPI2 $B -t 1,128,512,4096 --num-sms $sms --zero-copy-combine -J "$OUT/bench_pull_sms$sms.json"
  done
fi
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
