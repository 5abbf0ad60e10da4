#!/usr/bin/env bash
# One device call (2 GPUs) for the fourth session's changes, most important
# first: the exhaustive vector-store conversion test; the pull combine with
# hardware bf16 rounding and division-free ring positions (bench at 4096 on
# all / 24 / 16 / 8 SMs and 512 on 16, producers 1, 2, 4 on 16); the NCCL
# dispatch benched next to NCCL's own, with its stage profile; the suites and
# sanitizers the changes touch.  (At a6cc0c8 it also ran the dispatch with its
# metadata ahead of the rows and with fewer own-row pack blocks; both were
# measured slower and removed with their switches, docs/nccl_backend.md.)
#   usage: OUT=/dir bash scripts/gpu/session4_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-560}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 200 moe_ep_conformance test_nvlink_gpu test_nccl_gpu test_float_convert
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
B="bench --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
ROW="^ +[0-9]+ \|"

PICK="mismatches" step float_convert 60 $BUILD/test/nvlink/test_float_convert
pull() {  # NAME SMS TOKENS [ENV...]
  local name=$1 sms=$2 tokens=$3
  shift 3
  NPICK=2 PICK="$ROW" step "$name" 25 $MPI2 "$@" $TOOL $B --backend nvlink -w 5 -n 20 --graph --zero-copy-combine \
    --no-baselines -t "$tokens" --num-sms "$sms"
}
pull pull_all 0 1,128,512,4096
pull pull_sms16 16 512,4096
pull pull_sms8 8 4096
pull pull_sms24 24 4096
pull pull_sms16_p2 16 4096 -x MOE_EP_PULL_PRODUCERS=2
pull pull_sms16_p4 16 4096 -x MOE_EP_PULL_PRODUCERS=4
nccl() {  # NAME [ENV...]
  local name=$1
  shift
  NPICK=6 PICK="$ROW|stages" step "$name" 60 $MPI2 -x MOE_EP_LOG=info "$@" $TOOL $B --backend nccl \
    -t 4096 -w 5 -n 30
}
nccl nccl_plain
nccl nccl_plain_profile -x MOE_EP_NCCL_PROFILE=1
nvlink_suites 120 nvlink_gpu_np2 nvlink_gpu_dispatch_bulk_np2 nccl_gpu_np2
step racecheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
step memcheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[zero_copy],[bad_ids]"
step memcheck_nccl 90 $MPI2 $SAN --tool memcheck --report-api-errors no \
  $TOOL check --backend nccl --filter basic --modes eager --rounds 1
step check_nccl_network 90 $MPI2 $NET_ENV \
  sh -c "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL check --backend nccl"
nvlink_suites 120 nccl_gpu_network_np2 nvlink_gpu_general_kernels_np2
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
