#!/usr/bin/env bash
# Eleventh session, one GPU: where the small-batch combine kernel (serial push
# schedule) should hand over to the general one, and v32 (the small dispatch
# kernel up to 512 tokens) with two ranks.  One binary, alternated four times:
# MOE_EP_SMALL_COMBINE_TOKENS = 128 against 512 on one rank (mpirun -np 1,
# bench --graph at 192, 256, 384 and 512 tokens: world 1, so combine only
# reduces, which times the reduce side's difference at ±0.1 us) and in the
# two-rank proxy without the zero-copy view (PROXY_PUSH=1: the rows pushed,
# 66 SMs per rank, eager, noisier); MOE_EP_SMALL_DISPATCH_TOKENS = 128 against
# 512 in the proxy (two destinations per token).  Then the whole one-GPU
# validation with both bounds at 512 exported (the small-batch case and
# sanitizers among it).
#   usage: OUT=/dir bash scripts/gpu/small_combine_bound.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 240
proxy_build "$PWD/$BUILD" /tmp/proxy_new >> "$OUT/proxy_build.log" 2>&1 || { echo "proxy_new: FAILED" | tee -a "$SUMMARY"; rc=1; }
TOOL=$BUILD/tools/moe_ep_conformance
for round in 1 2 3 4; do
  for bound in 128 512; do
    NPICK=4 nvlink_bench "np1_c${bound}_$round" 1 $TOOL 192,256,384,512 20 300 MOE_EP_SMALL_COMBINE_TOKENS=$bound
  done
done
for round in 1 2 3 4; do
  for t in 192 256 512; do
    for bound in 128 512; do
      ab_proxy "push_c$bound:new" "t${t}_$round" $t 66 20 200 PROXY_PUSH=1 MOE_EP_SMALL_COMBINE_TOKENS=$bound
    done
  done
done
for round in 1 2 3 4; do
  for t in 256 512; do
    for bound in 128 512; do
      ab_proxy "pull_d$bound:new" "t${t}_$round" $t 66 20 200 MOE_EP_SMALL_DISPATCH_TOKENS=$bound
    done
  done
done
export MOE_EP_SMALL_DISPATCH_TOKENS=512 MOE_EP_SMALL_COMBINE_TOKENS=512
one_gpu_validation
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
