#!/usr/bin/env bash
# Tenth session, one GPU: the small-batch dispatch kernel's own cost, timed
# without a peer.  One rank (mpirun -np 1) of the NVLink backend runs the
# whole kernel (routing, its own rows, padding, fence, its own arrival, the
# counts) with no link and no second rank whose start skews the time, so
# CUDA-graph replays give a clean figure (±0.1 us) of what the kernel adds to
# a call.  Release builds of the conformance tool from .ab_base/ ("base") and
# every other .ab_NAME/ ("NAME"; `git archive REV | tar -x -C DIR`, or a tree
# with one change) against this tree ("new"), alternated four times: bench --graph at 1, 8, 32 and 128
# tokens (DeepSeek shape); this tree with the general kernels
# (MOE_EP_SMALL_BATCH=0); the latency probe's evented empty call on the same
# GPU (the floor of a call timed this way); a -DMOE_EP_DIAGNOSTICS build's
# per-phase stamps of the small and general kernels
# (MOE_EP_DISPATCH_DIAGNOSTIC=4, dispatch_trace.py); then this tree's NVLink
# suites, the conformance check and memcheck / racecheck on the padding cases,
# or with FULL=1 the session's validation: every GPU CTest suite that runs on
# one GPU, the check on 2 and 4 ranks, zero-copy, 8 SMs and either routing,
# the fd exchange as root, and memcheck / racecheck / synccheck on the NVLink
# kernels with either routing.
# TRACE=0 leaves the diagnostic build and its stamps out; SIZES (default
# 1,8,32,128) the bench's token counts.
#   usage: OUT=/dir [FULL=1] [TRACE=0] [SIZES=...] bash scripts/gpu/small_batch_np1.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-500}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
VARIANTS=""
for dir in .ab_base .ab_*; do  # base first, then every other source tree beside it
  [ -d "$dir" ] || continue
  name=${dir#.ab_}
  case " $VARIANTS " in *" $name "*) continue ;; esac
  tool_build "$name" "$PWD/$dir"
  VARIANTS="$VARIANTS $name"
done
VARIANTS="$VARIANTS new"
[ "${TRACE:-1}" = 1 ] && tool_build diag "$PWD" -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS
np1() { nvlink_bench "$1" 1 "${@:2}"; }  # label tool tokens warmup iters [VAR=VALUE...]
tool_of() { [ "$1" = new ] && echo "$BUILD/tools/moe_ep_conformance" || echo "$PWD/build-tool-$1/tools/moe_ep_conformance"; }
for round in 1 2 3 4; do
  for v in $VARIANTS; do np1 "np1_${v}_$round" "$(tool_of $v)" "${SIZES:-1,8,32,128}" 20 300; done
done
np1 np1_new_general "$(tool_of new)" "${SIZES:-1,8,32,128}" 20 300 MOE_EP_SMALL_BATCH=0
NPICK=3 PICK="^graph_1_kernel |^graph_evented_1_kernel|^kernel_evented_eager" step probe_call 120 \
  "$BUILD/tools/latency_probe/moe_ep_latency_probe" --only launch,call --json "$OUT/latency.json"
if [ "${TRACE:-1}" = 1 ]; then
  DIAG_TOOL=$PWD/build-tool-diag/tools/moe_ep_conformance
  for t in 1 8 128; do np1 "np1_trace_small_t$t" "$DIAG_TOOL" $t 3 3 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
  np1 np1_trace_general_t1 "$DIAG_TOOL" 1 3 3 MOE_EP_DISPATCH_DIAGNOSTIC=4 MOE_EP_SMALL_BATCH=0
  trace_summaries
fi
if [ "${FULL:-0}" = 1 ]; then
  one_gpu_validation
else
  TOOL="$BUILD/tools/moe_ep_conformance"
  MPI2="mpirun -np 2 --bind-to none"
  SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
  GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
  nvlink_suites 150 nvlink_gpu_np1 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2 nvlink_gpu_dispatch_lookback_np2
  step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
  step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink
  step memcheck_padding 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "token counts*,[routing]"
  step racecheck_padding 150 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "token counts*"
fi
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
