#!/usr/bin/env bash
# Eighth session, one GPU: dispatch with block 0 owning no rows on large
# grids (v24), on the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp),
# -DMOE_EP_DIAGNOSTICS builds of this tree with the threshold at 32 (the
# default), 16, and never (the behaviour before v24), alternated twice: 4096
# tokens on 8-66 SMs, 512 tokens, 16-byte rows (PROXY_HIDDEN=8); per-block
# phase times (MOE_EP_DISPATCH_DIAGNOSTIC=4, dispatch_trace.py); then the
# release build: the NVLink GPU suites that test dispatch, the conformance
# check (several ranks on the one GPU), memcheck and racecheck on the routing
# cases.
# Runs on the tree of commit a5d437a (v24), where the threshold was the
# measurement macro MOE_EP_IDLE_BLOCK_ZERO_MIN_BLOCKS (v25 replaced it).
#   usage: OUT=/dir bash scripts/gpu/block_zero_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-480}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
diag_build() {  # name min_blocks
  PICK="Linking|error" step "build_$1" 120 bash -c "cmake -S . -B '$PWD/build-$1' -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='$PWD/.device-deps/usr' \
    -DCMAKE_CUDA_FLAGS='-DMOE_EP_DIAGNOSTICS -DMOE_EP_IDLE_BLOCK_ZERO_MIN_BLOCKS=$2' \
    -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS && ninja -C '$PWD/build-$1' -j32 moe_ep"
  proxy_build "$PWD/build-$1" "/tmp/proxy_$1" >> "$OUT/proxy_build.log" 2>&1 || echo "proxy_$1: FAILED" | tee -a "$SUMMARY"
}
diag_build never 1000000
diag_build idle32 32
diag_build idle16 16
proxy() {  # variant name tokens sms warmup iters [env...]
  local v=$1 name=$2 t=$3 sms=$4 w=$5 n=$6
  shift 6
  NPICK=1 PICK="^proxy" step "${v}_$name" 40 env "$@" "/tmp/proxy_$v" "$t" "$sms" "$w" "$n"
}
for round in 1 2; do
  for v in never idle32 idle16; do
    for sms in 8 16 24 32 66; do proxy $v "t4096_sms${sms}_$round" 4096 $sms 5 30; done
    proxy $v "h8_t4096_sms66_$round" 4096 66 5 30 PROXY_HIDDEN=8
    proxy $v "t512_sms66_$round" 512 66 5 30
  done
done
for v in never idle32; do
  for sms in 24 66; do proxy $v "trace_t4096_sms$sms" 4096 $sms 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
  proxy $v "trace_h8_t4096_sms66" 4096 66 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4 PROXY_HIDDEN=8
done
for f in "$STEP_LOG_DIR"/*trace_*.log; do
  { echo "== $(basename "$f" .log)"; python3 "$(dirname "$0")/dispatch_trace.py" "$f"; } >> "$OUT/trace_summary.txt"
done
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_bulk_general_np2
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
step memcheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[routing],[bad_ids]"
step racecheck_routing 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[routing]"
step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8 90 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
