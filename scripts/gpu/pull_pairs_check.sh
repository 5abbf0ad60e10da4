#!/usr/bin/env bash
# One device call (2 GPUs): the whole-row pull of this tree (v18: up to two
# partial rows per step; v19: one NaN test per output vector, the consumers'
# vector count a constant) on 16, 8, 24 and all SMs, its producer counts; and, from a second build with -DMOE_EP_DIAGNOSTICS,
# the kernel with parts switched off (MOE_EP_PULL_DIAGNOSTIC: 1 no adds, 2 no
# output stores) to time the rest.  4096 tokens, DeepSeek shape, graph,
# zero-copy combine; then every size on all SMs.  Correctness first: check
# --zero-copy-combine (every case through the pull), the NVLink suites,
# racecheck and memcheck on [zero_copy].
#   usage: OUT=/dir bash scripts/gpu/pull_pairs_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-420}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep_conformance test_nvlink_gpu test_float_convert
DIAG=build-diag
# The diagnostic build runs in the background while the checks use the GPUs.
(cmake -S . -B $DIAG -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS \
  -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS && ninja -C $DIAG -j16 moe_ep_conformance) > "$OUT/diag_build.log" 2>&1 &
diag_pid=$!
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
step check_pull 90 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nvlink $SHAPE -t 4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines"
bench() {  # name sms [env...]
  local name=$1 sms=$2
  shift 2
  local envs=()
  for e in "$@"; do envs+=(-x "$e"); done
  NPICK=1 PICK="^ +4096 \|" step "$name" 25 $MPI2 "${envs[@]}" ${TOOL_OVERRIDE:-$TOOL} $B --num-sms "$sms"
}
for sms in 16 8 24 0; do bench "pull_sms${sms}" $sms; done
for producers in 1 3; do bench "pull_sms16_p$producers" 16 MOE_EP_PULL_PRODUCERS=$producers; done
bench pull_sms8_p1 8 MOE_EP_PULL_PRODUCERS=1
wait $diag_pid && echo "build_diag: ok" | tee -a "$SUMMARY" || { echo "build_diag: FAILED" | tee -a "$SUMMARY"; tail -20 "$OUT/diag_build.log"; }
for d in 1 2; do
  TOOL_OVERRIDE=$DIAG/tools/moe_ep_conformance bench "pull_sms16_diag$d" 16 MOE_EP_PULL_DIAGNOSTIC=$d
  TOOL_OVERRIDE=$DIAG/tools/moe_ep_conformance bench "pull_sms8_diag$d" 8 MOE_EP_PULL_DIAGNOSTIC=$d
done
NPICK=4 PICK="^ +[0-9]+ \|" step bench_sizes 60 $MPI2 $TOOL bench --backend nvlink $SHAPE -t 1,128,512,4096 -w 10 -n 50 \
  --graph --zero-copy-combine --no-baselines
nvlink_suites 120 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 float_convert_gpu
step racecheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 compute-sanitizer --print-limit 20 --error-exitcode 3 --tool racecheck \
  $BUILD/test/nvlink/test_nvlink_gpu "[zero_copy]"
step memcheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 compute-sanitizer --print-limit 20 --error-exitcode 3 --tool memcheck \
  $BUILD/test/nvlink/test_nvlink_gpu "[zero_copy]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
