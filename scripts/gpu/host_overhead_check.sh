#!/usr/bin/env bash
# Seventh session, one GPU: the host time an eager caller spends inside
# moe_ep_dispatch / moe_ep_combine (the one-GPU proxy, pull_proxy_bench, at
# 1, 128 and 4096 tokens), and the torch bindings suite, whose NCCL-group case
# now skips where GPUs are fewer than ranks.
#   usage: OUT=/dir bash scripts/gpu/host_overhead_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 240
proxy_build "$PWD/$BUILD" /tmp/proxy > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
NPICK=3 PICK="passed|failed|skipped|SKIPPED" step ctest_python_bindings_torch_np2 150 ctest --test-dir $BUILD \
  -R "^python_bindings_torch_np2\$" --output-on-failure -V --timeout 140
for t in 1 128 4096; do
  NPICK=2 PICK="^proxy|^host" step "proxy_t$t" 30 /tmp/proxy $t 16 20 200
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
