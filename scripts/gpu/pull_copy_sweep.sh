#!/usr/bin/env bash
# One device call (2 GPUs): the whole-row pull with every consumer thread
# releasing the row buffer (racecheck on [zero_copy]) and rows brought in
# copies of at most MOE_EP_PULL_COPY_BYTES: build; the NVLink GPU suites (the
# np2 suite also with 2 KiB copies); compute-sanitizer; then bench, DeepSeek
# shape, graph, --zero-copy-combine, 512 and 4096 tokens on 8, 16, 24 SMs and
# all, for copies of 16384 (one per row), 4096, 2048 and 1024 bytes.
#   usage: OUT=/dir bash scripts/gpu/pull_copy_sweep.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-240}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 90 test_nvlink_gpu moe_ep_conformance
nvlink_suites 40 nvlink_gpu_np2 nvlink_gpu_overlapped_np2 nvlink_gpu_overlapped_phases_np2 nvlink_gpu_general_kernels_np2
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step np2_copies_2k 30 mpirun -np 2 --bind-to none -x MOE_EP_PULL_COPY_BYTES=2048 $GPU_TEST
SAN="compute-sanitizer --print-limit 4 --error-exitcode 3"
for tool in memcheck synccheck racecheck; do
  step "${tool}_zero_copy" 45 mpirun -np 2 --bind-to none -x MOE_EP_FABRIC=0 $SAN --tool $tool $GPU_TEST "[zero_copy]"
done
step racecheck_zero_copy_2k 45 mpirun -np 2 --bind-to none -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_COPY_BYTES=2048 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
TOOL=$BUILD/tools/moe_ep_conformance
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --zero-copy-combine --no-baselines -t 512,4096"
for bytes in 16384 4096 2048 1024; do
  for sms in 0 24 16 8; do
    NPICK=2 PICK="^ +[0-9]+ \|" step "copy${bytes}_sms$sms" 20 mpirun -np 2 --bind-to none -x MOE_EP_PULL_COPY_BYTES=$bytes $TOOL $B --num-sms $sms
  done
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
