#!/usr/bin/env bash
# One device call (2 GPUs): the whole-row pull with as many row buffers as fit
# (v18: 14 of 14 KiB for the DeepSeek row) against 12 (MOE_EP_PULL_STAGES=12),
# the consumers' group release (MOE_EP_PULL_RELEASE=group), and, from a
# second build with -DMOE_EP_PULL_DIAGNOSTICS, the kernel with parts switched
# off (MOE_EP_PULL_DIAGNOSTIC: 1 no adds, 2 no output stores, 4 no copies) to
# time the rest.  4096 tokens, DeepSeek shape, graph, zero-copy combine.
# Correctness first: check --zero-copy-combine (every case through the pull)
# with each variant, the NVLink suite, racecheck on [zero_copy].
#   usage: OUT=/dir bash scripts/gpu/pull_depth_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-420}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep_conformance test_nvlink_gpu
DIAG=build-diag
# The diagnostic build runs in the background while the checks use the GPUs.
(cmake -S . -B $DIAG -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DCMAKE_CUDA_FLAGS=-DMOE_EP_PULL_DIAGNOSTICS \
  -DCMAKE_CXX_FLAGS=-DMOE_EP_PULL_DIAGNOSTICS && ninja -C $DIAG -j16 moe_ep_conformance) > "$OUT/diag_build.log" 2>&1 &
diag_pid=$!
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
step check_pull 90 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
step check_pull_group 90 $MPI2 -x MOE_EP_PULL_RELEASE=group $TOOL check --backend nvlink --zero-copy-combine
step check_pull_stages12 90 $MPI2 -x MOE_EP_PULL_STAGES=12 $TOOL check --backend nvlink --zero-copy-combine --filter zero_copy
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nvlink $SHAPE -t 4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines"
bench() {  # name sms [env...]
  local name=$1 sms=$2
  shift 2
  local envs=()
  for e in "$@"; do envs+=(-x "$e"); done
  NPICK=1 PICK="^ +4096 \|" step "$name" 25 $MPI2 "${envs[@]}" ${TOOL_OVERRIDE:-$TOOL} $B --num-sms "$sms"
}
for sms in 16 8 24 0; do
  bench "pull_sms${sms}" $sms
  bench "pull_sms${sms}_stages12" $sms MOE_EP_PULL_STAGES=12
done
for sms in 16 8; do bench "pull_sms${sms}_group" $sms MOE_EP_PULL_RELEASE=group; done
wait $diag_pid && echo "build_diag: ok" | tee -a "$SUMMARY" || { echo "build_diag: FAILED" | tee -a "$SUMMARY"; tail -20 "$OUT/diag_build.log"; }
for d in 1 2 4 3; do
  TOOL_OVERRIDE=$DIAG/tools/moe_ep_conformance bench "pull_sms16_diag$d" 16 MOE_EP_PULL_DIAGNOSTIC=$d
done
bench pull_sms16_p1 16 MOE_EP_PULL_PRODUCERS=1
nvlink_suites 120 nvlink_gpu_np2
step racecheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 compute-sanitizer --print-limit 20 --error-exitcode 3 --tool racecheck \
  $BUILD/test/nvlink/test_nvlink_gpu "[zero_copy]"
step racecheck_pull_group 90 $MPI2 -x MOE_EP_FABRIC=0 -x MOE_EP_PULL_RELEASE=group compute-sanitizer --print-limit 20 \
  --error-exitcode 3 --tool racecheck $BUILD/test/nvlink/test_nvlink_gpu "[zero_copy]"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
