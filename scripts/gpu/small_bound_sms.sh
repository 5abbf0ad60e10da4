#!/usr/bin/env bash
# Eleventh session, one GPU: the small-batch kernels up to 512 tokens (v32,
# v33) on a small SM budget, where the small dispatch kernel's block 0, which
# owns no token, is a larger part of the grid.  One binary, both bounds (the
# small kernels up to 512 against the general kernels above 128) alternated
# four times: one rank, bench --graph at 128, 256 and 512 tokens with
# --num-sms 8, 16 and 24; the two-rank proxy at 256 and 512 tokens on 8 and 16
# SMs per rank, with the view (pull) and without it (push).  Run first on
# 46385f5 (block 0 owning no token), then with block 0's share from the model
# (v34, small_first_block_share), also on all 132 SMs; FULL=1 adds the whole
# one-GPU validation (every build target then).
#   usage: OUT=/dir [FULL=1] bash scripts/gpu/small_bound_sms.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-400}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
if [ "${FULL:-0}" = 1 ]; then build_step 240; else build_step 240 moe_ep moe_ep_conformance; fi
proxy_build "$PWD/$BUILD" /tmp/proxy_new >> "$OUT/proxy_build.log" 2>&1 || { echo "proxy_new: FAILED" | tee -a "$SUMMARY"; rc=1; }
TOOL=$BUILD/tools/moe_ep_conformance
bounds() { echo "MOE_EP_SMALL_DISPATCH_TOKENS=$1 MOE_EP_SMALL_COMBINE_TOKENS=$1"; }
for round in 1 2 3 4; do
  for sms in 8 16 24 132; do
    for bound in 128 512; do
      NPICK=3 BENCH_ARGS="--num-sms $sms" nvlink_bench "np1_s${sms}_b${bound}_$round" 1 $TOOL 128,256,512 20 200 \
        $(bounds $bound)
    done
  done
done
for round in 1 2 3; do
  for sms in 8 16; do
    for t in 256 512; do
      for bound in 128 512; do
        ab_proxy "pull_s${sms}_b$bound:new" "t${t}_$round" $t $sms 10 100 $(bounds $bound)
        ab_proxy "push_s${sms}_b$bound:new" "t${t}_$round" $t $sms 10 100 PROXY_PUSH=1 $(bounds $bound)
      done
    done
  done
done
[ "${FULL:-0}" = 1 ] && one_gpu_validation
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
