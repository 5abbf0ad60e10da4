#!/usr/bin/env bash
# One device call (2 GPUs): where dispatch's dip on 20-24 SMs comes from.
# A build with -DMOE_EP_DIAGNOSTICS times dispatch at 4096 tokens (DeepSeek
# shape, graph) on 16, 20, 24, 28, 32 and all SMs three ways:
# MOE_EP_DISPATCH_DIAGNOSTIC=0 (the normal kernel), 1 (no hidden rows written
# to this rank: peers' rows only, over NVLink), 2 (no rows to the peers: this
# rank's own rows only, local HBM).  Results of 1 and 2 are wrong by design.
#   usage: OUT=/dir bash scripts/gpu/dispatch_dip_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-240}
BUILD=${BUILD:-build-diag}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
PICK="Linking|error" step build 150 bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS \
  -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS && ninja -C $BUILD -j32 moe_ep_conformance"
TOOL=$BUILD/tools/moe_ep_conformance
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 10 -n 40 \
  --graph --no-baselines"
for sms in 16 20 24 28 32 0; do
  for d in 0 1 2; do
    NPICK=1 PICK="^ +4096 \|" step "dispatch_sms${sms}_diag$d" 25 mpirun -np 2 --bind-to none \
      -x MOE_EP_DISPATCH_DIAGNOSTIC=$d $TOOL $B --num-sms $sms
  done
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
