#!/usr/bin/env bash
# The validation of a GPU machine, from the repository root:
#   1. build everything (Release, ninja -j32);
#   2. every GPU CTest suite (label gpu), one at a time, since they measure
#      device memory; a suite needing more GPUs than there are skips and says so;
#   3. moe_ep_conformance check: NVLink on 2 ranks (plain, zero-copy combine,
#      8 SMs), on 4 ranks sharing the GPUs, and, with 2 GPUs or more, NCCL over
#      NVLink (one GPU per rank) and over its socket transport, each rank a
#      node of its own (test/tools/rank_as_node.sh; on one GPU too);
#   4. compute-sanitizer memcheck, racecheck and synccheck on the NVLink kernels
#      (the GPU suite's peer-count, bad-id, zero-copy, routing, small-batch and
#      token-count cases, 2 ranks), and memcheck on the NCCL backend's kernels.
#   usage: OUT=/dir [BUILD=build-gpu] [DEPS=prefix] bash scripts/gpu/validate.sh
# Writes $OUT/summary.txt (one line per step) and $OUT/logs/STEP.log.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/steps.sh

build_step
[ -x "$BUILD/tools/moe_ep_conformance" ] || finish
GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --oversubscribe --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
CASES="[peer_counts],[bad_ids],[zero_copy],[routing],[small_batch],token counts*"

for t in $(cd "$BUILD" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p'); do
  step "ctest_$t" 600 ctest --test-dir "$BUILD" -R "^$t\$" --output-on-failure
done

step check_nvlink 120 $MPI2 $TOOL check --backend nvlink
step check_nvlink_zero_copy 120 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
step check_nvlink_sms8 120 $MPI2 $TOOL check --backend nvlink --num-sms 8 --zero-copy-combine
step check_nvlink_4ranks 180 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
if [ "$GPUS" -ge 2 ]; then
  step check_nccl 120 $MPI2 $TOOL check --backend nccl
else
  echo "check_nccl: skipped (NCCL over NVLink needs one GPU per rank: $GPUS GPU for 2 ranks)" | tee -a "$SUMMARY"
fi
# Each rank a node of its own to NCCL, over its socket transport (on one GPU too).
step check_nccl_network 300 $MPI2 -x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo \
  sh test/tools/rank_as_node.sh $TOOL check --backend nccl --layouts rank_major

# MOE_EP_FABRIC=0: without an IMEX channel the driver refuses the FABRIC cuMemCreate
# that the backend tries first, and compute-sanitizer would report that refusal.
step memcheck_nvlink 300 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "$CASES"
step racecheck_nvlink 300 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "$CASES"
step synccheck_nvlink 300 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "$CASES"
if [ "$GPUS" -ge 2 ]; then
  step memcheck_nccl 300 $MPI2 $SAN --tool memcheck --report-api-errors no $TOOL check --backend nccl \
    --filter basic --modes eager --rounds 1
fi
finish
