#!/usr/bin/env bash
# Eleventh session, one GPU: where the small-batch dispatch kernel should hand
# over to the general one.  The small kernel routes in one round of one token
# per thread, so it can take up to 512 tokens per rank; the default hand-over
# was 128 (kSmallBatchMaxTokens, set with the combine's).  One binary, the
# switch MOE_EP_SMALL_DISPATCH_TOKENS = 128 (general kernel above 128) against
# 512 (small kernel up to 512), alternated four times: bench --graph at 128,
# 192, 256, 384 and 512 tokens on one rank (mpirun -np 1: no link, no skew,
# ±0.1 us) and on two ranks sharing the GPU (world 2, two destinations per
# token; noisier); the per-phase stamps of both kernels at 256 and 512 tokens
# (a -DMOE_EP_DIAGNOSTICS build); then the NVLink suites (the new small-batch
# case at 512 tokens among them) with the small kernel up to 512 tokens and
# with the general kernels, the conformance check on 2 and 4 ranks with each
# bound, and memcheck / racecheck / synccheck on the small kernel at 512.
#   usage: OUT=/dir [TRACE=0] bash scripts/gpu/small_dispatch_bound.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-500}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
[ "${TRACE:-1}" = 1 ] && tool_build diag "$PWD" -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS
TOOL=$BUILD/tools/moe_ep_conformance
SIZES=128,192,256,384,512
bench_ranks() { NPICK=5 nvlink_bench "$@"; }  # label ranks tool tokens warmup iters [VAR=VALUE...]
for round in 1 2 3 4; do
  for bound in 128 512; do
    bench_ranks "np1_b${bound}_$round" 1 "$TOOL" $SIZES 20 300 MOE_EP_SMALL_DISPATCH_TOKENS=$bound
  done
done
for round in 1 2; do
  for bound in 128 512; do
    bench_ranks "np2_b${bound}_$round" 2 "$TOOL" $SIZES 20 200 MOE_EP_SMALL_DISPATCH_TOKENS=$bound
  done
done
if [ "${TRACE:-1}" = 1 ]; then
  DIAG_TOOL=$PWD/build-tool-diag/tools/moe_ep_conformance
  for t in 256 512; do
    for bound in 128 512; do
      bench_ranks "np1_trace_b${bound}_t$t" 1 "$DIAG_TOOL" $t 3 3 MOE_EP_SMALL_DISPATCH_TOKENS=$bound \
        MOE_EP_DISPATCH_DIAGNOSTIC=4
    done
  done
  trace_summaries
fi
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MOE_EP_SMALL_DISPATCH_TOKENS=512 nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 \
  nvlink_gpu_dispatch_bulk_np2
for bound in 128 512; do
  step "check_nvlink_b$bound" 90 $MPI2 -x MOE_EP_SMALL_DISPATCH_TOKENS=$bound $TOOL check --backend nvlink
  step "check_nvlink_4ranks_b$bound" 120 mpirun -np 4 --oversubscribe --bind-to none \
    -x MOE_EP_SMALL_DISPATCH_TOKENS=$bound $TOOL check --backend nvlink
done
for tool in memcheck racecheck synccheck; do
  step "${tool}_small512" 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool $tool $GPU_TEST "[small_batch]"
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
