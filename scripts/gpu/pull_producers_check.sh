#!/usr/bin/env bash
# The whole-row pull with several producer warps per block
# (MOE_EP_PULL_PRODUCERS), most important first, each step written to
# $OUT/summary.txt as it ends (a short budget keeps what finished): build; bench
# at 4096 (and 512) tokens, DeepSeek shape, graph, --zero-copy-combine, on 16
# and 8 SMs with 4 producers (the oracle's #wrong in every row); the np2 suite
# with 4 producers; all SMs with 4; 16 SMs with 2 and 1.
#   usage: OUT=/dir bash scripts/gpu/pull_producers_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-120}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 60 test_nvlink_gpu moe_ep_conformance
TOOL=$BUILD/tools/moe_ep_conformance
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 5 -n 20 --graph --zero-copy-combine --no-baselines"
run() {  # NAME PRODUCERS SMS TOKENS
  NPICK=2 PICK="^ +[0-9]+ \|" step "$1" 15 mpirun -np 2 --bind-to none -x MOE_EP_PULL_PRODUCERS=$2 $TOOL $B -t $4 --num-sms $3
}
run p4_sms16 4 16 512,4096
run p4_sms8 4 8 4096
step np2_p4 20 mpirun -np 2 --bind-to none -x MOE_EP_PULL_PRODUCERS=4 $BUILD/test/nvlink/test_nvlink_gpu
run p4_all 4 0 1,4096
run p2_sms16 2 16 4096
run p1_sms16 1 16 4096
run p4_sms24 4 24 4096
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
