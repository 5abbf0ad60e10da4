#!/usr/bin/env bash
# One short device call (2 GPUs): the NCCL dispatch's joined metadata
# operation with its [block | rows] start 256-byte aligned, benched between
# two runs of the separate operations (MOE_EP_NCCL_JOIN_METADATA=0) in the
# same call, after the two NCCL GPU suites that exercise it.
#   usage: OUT=/dir bash scripts/gpu/nccl_join_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-150}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 60 moe_ep_conformance test_nvlink_gpu
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nccl --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 5 -n 30"
NPICK=4 PICK="^ +4096 \|" step bench_nccl_separate 20 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_joined_aligned 20 $MPI2 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_separate_again 20 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL $B
nvlink_suites 40 nccl_gpu_np2 nccl_gpu_network_np2
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
