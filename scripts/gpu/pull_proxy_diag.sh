#!/usr/bin/env bash
# Seventh session, one GPU: what is left of the 8-SM pull combine after v22,
# on the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp): the normal build
# with 1, 2 and 3 producer warps, and a -DMOE_EP_DIAGNOSTICS build with the
# consumers' adds, their output stores or the copies switched off
# (MOE_EP_PULL_DIAGNOSTIC 1, 2, 4; results then wrong), on 8 and 16 SMs.
#   usage: OUT=/dir bash scripts/gpu/pull_proxy_diag.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
BUILD=${BUILD:-build-final}
DIAG=build-diag
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
(cmake -S . -B $DIAG -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS \
  -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS && ninja -C $DIAG -j8 moe_ep) > "$OUT/diag_build.log" 2>&1 &
diag_pid=$!
build_step 150 moe_ep
proxy_build "$PWD/$BUILD" /tmp/proxy > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
run() {  # name sms [env...]
  local name=$1 sms=$2
  shift 2
  NPICK=1 PICK="^proxy" step "$name" 30 env "$@" ${PROXY:-/tmp/proxy} 4096 "$sms" 5 30
}
for sms in 8 16; do
  for p in 2 1 3; do run "p${p}_sms$sms" $sms MOE_EP_PULL_PRODUCERS=$p; done
done
wait $diag_pid && proxy_build "$PWD/$DIAG" /tmp/proxy_diag >> "$OUT/diag_build.log" 2>&1 &&
  echo "diag_build: ok" | tee -a "$SUMMARY" || { echo "diag_build: FAILED" | tee -a "$SUMMARY"; tail -20 "$OUT/diag_build.log"; }
for sms in 8 16; do
  for d in 1 2 4; do PROXY=/tmp/proxy_diag run "diag${d}_sms$sms" $sms MOE_EP_PULL_DIAGNOSTIC=$d; done
  run "p2_sms${sms}_again" $sms
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
