#!/usr/bin/env bash
# One short device call (2 GPUs): MOE_EP_NCCL_REGISTER=0 on rank 1 only.  Create
# must agree on the plain workspace on both ranks (MOE_EP_LOG=info says so on
# each) and the registered-path cases must still pass with it.
#   usage: OUT=/dir bash scripts/gpu/nccl_register_mixed.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-150}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 100 moe_ep_conformance
TOOL=$BUILD/tools/moe_ep_conformance
ONE_OFF='MOE_EP_NCCL_REGISTER=$([ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo 0 || echo 1) exec'
NPICK=4 PICK="registered with NCCL|passed, " step check_mixed_wish 60 mpirun -np 2 --bind-to none -x MOE_EP_LOG=info \
  sh -c "$ONE_OFF $TOOL check --backend nccl --zero-copy-combine --filter zero_copy"
grep -o "buffers [a-z ]*registered with NCCL[^,]*" "$STEP_LOG_DIR/check_mixed_wish.log" | sort | uniq -c >> "$SUMMARY"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
