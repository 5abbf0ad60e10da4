#!/usr/bin/env bash
# Seventh session, one GPU (two-GPU machines were withheld): dispatch's bulk
# copies chosen by the SM budget (MOE_EP_DISPATCH_BULK unset: on at most
# kDispatchBulkAutoMaxSms SMs).  The one-GPU proxy (pull_proxy_bench: two ranks
# as threads of one process) with the bulk path forced on and off on 4 to 16
# SMs, alternated; then the NVLink suites and check with a budget that takes
# the automatic choice.
#   usage: OUT=/dir bash scripts/gpu/dispatch_bulk_auto_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-360}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep moe_ep_conformance test_nvlink_gpu
proxy_build "$PWD/$BUILD" /tmp/proxy > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
for sms in 4 6 8 10 12 16 24; do
  for round in 1 2; do
    for bulk in 0 1; do
      NPICK=1 PICK="^proxy" step "proxy_bulk${bulk}_sms${sms}_$round" 30 env MOE_EP_DISPATCH_BULK=$bulk /tmp/proxy 4096 \
        $sms 5 30
    done
  done
done
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
nvlink_suites 90 nvlink_gpu_np2 nvlink_gpu_general_kernels_np2
step check_sms8 60 $MPI2 -x MOE_EP_LOG=info $TOOL check --backend nvlink --num-sms 8
step check_sms8_zero_copy 60 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
grep -h "dispatch rows" "$STEP_LOG_DIR/check_sms8.log" | head -2 >> "$SUMMARY"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
