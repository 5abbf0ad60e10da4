#!/usr/bin/env bash
# Eighth session, one GPU: where the time of a 4096-token dispatch goes, on
# the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp) with a
# -DMOE_EP_DIAGNOSTICS build: the proxy's times at 8-66 SMs, the same with
# 16-byte rows (PROXY_HIDDEN=8: what is not the rows), and per-block phase
# times (MOE_EP_DISPATCH_DIAGNOSTIC=4, summarised by dispatch_trace.py).
#   usage: OUT=/dir bash scripts/gpu/dispatch_trace_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
diag_proxy diag "$PWD"
proxy() {  # name tokens sms warmup iters [env...]
  local name=$1 t=$2 sms=$3 w=$4 n=$5
  shift 5
  NPICK=1 PICK="^proxy" step "$name" 40 env "$@" /tmp/proxy_diag "$t" "$sms" "$w" "$n"
}
for sms in 8 16 24 32 66; do proxy "t4096_sms$sms" 4096 $sms 5 30; done
for sms in 16 66; do proxy "h8_t4096_sms$sms" 4096 $sms 5 30 PROXY_HIDDEN=8; done
proxy "t512_sms66" 512 66 5 30
for sms in 8 16 24 66; do proxy "trace_t4096_sms$sms" 4096 $sms 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4; done
proxy "trace_h8_t4096_sms66" 4096 66 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4 PROXY_HIDDEN=8
proxy "trace_t512_sms66" 512 66 3 1 MOE_EP_DISPATCH_DIAGNOSTIC=4
for f in "$STEP_LOG_DIR"/trace_*.log; do
  { echo "== $(basename "$f" .log)"; python3 "$(dirname "$0")/dispatch_trace.py" "$f"; } >> "$OUT/trace_summary.txt"
done
cat "$OUT/trace_summary.txt" >> "$SUMMARY"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
