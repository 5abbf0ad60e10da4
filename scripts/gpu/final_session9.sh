#!/usr/bin/env bash
# Ninth session's validation of main on ONE GPU (nvidia-h200; the two-GPU
# machines were withheld): build everything; every GPU CTest suite that runs on
# one GPU (the NVLink ones run several ranks on it; NCCL refuses two ranks on
# one GPU, so its suites are left for a two-GPU machine); the conformance check
# on the NVLink backend (2 and 4 ranks, zero-copy, 8 SMs, the dispatch
# look-back forced); the fd exchange as root; compute-sanitizer memcheck,
# racecheck and synccheck on the NVLink kernels, the routing cases with either
# routing; the one-GPU proxy (scripts/gpu/pull_proxy_bench.cpp): 4096 tokens on
# 8-24 SMs, and where the look-back starts to pay (1024 and 2048 tokens, auto /
# scan / look-back; SWEEP=0 leaves that out).
#   usage: OUT=/dir [SWEEP=0] bash scripts/gpu/final_session9.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"
build_step 240
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
proxy_build "$PWD/$BUILD" /tmp/proxy > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
for sms in 8 16 24 32 66; do
  NPICK=1 PICK="^proxy" step "proxy_sms$sms" 30 /tmp/proxy 4096 $sms 5 30
done
for round in $([ "${SWEEP:-1}" = 0 ] || echo 1 2); do
  for t in 1024 2048; do
    for sms in 16 32 66; do
      for mode in auto 0 1; do
        NPICK=1 PICK="^proxy" step "proxy_t${t}_sms${sms}_${mode}_$round" 30 \
          env MOE_EP_DISPATCH_LOOKBACK=$mode /tmp/proxy $t $sms 5 30
      done
    done
  done
done
one_gpu_validation
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
