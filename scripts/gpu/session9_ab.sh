#!/usr/bin/env bash
# Ninth session, one GPU: the session's final dispatch (v27-v28) against the
# eighth session's final tree (.ab_base/ = `git archive 2cbc486`, v25) on the
# one-GPU proxy, -DMOE_EP_DIAGNOSTICS builds, alternated three times: 4096
# tokens on 8-66 SMs (look-back up to 32 blocks, scan beyond), 512-2048 tokens
# on 32 and 66 SMs (scan).
#   usage: OUT=/dir bash scripts/gpu/session9_ab.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
ab_builds
for round in 1 2 3; do
  for v in base new; do
    for sms in 8 16 24 32 66; do ab_proxy $v "t4096_sms${sms}_$round" 4096 $sms 5 30; done
    for t in 512 1024 2048; do
      for sms in 32 66; do ab_proxy $v "t${t}_sms${sms}_$round" $t $sms 5 50; done
    done
  done
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
