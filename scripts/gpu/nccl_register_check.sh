#!/usr/bin/env bash
# One device call (2 GPUs): the NCCL backend with its workspace registered
# with NCCL (config.zero_copy_combine, the default MOE_EP_NCCL_REGISTER):
#  1. the bench at 4096 tokens, eager, registered / MOE_EP_NCCL_REGISTER=0 /
#     registered again, and without the view (never registered), each next to
#     NCCL's own grouped send/recv in the same run; the registered one also in
#     a graph and over NCCL's socket transport;
#  2. check --backend nccl --zero-copy-combine (every case through the
#     registered path) over NVLink and over sockets, the NCCL GPU suites
#     (their zero-copy cases pass the view on some ranks and their own buffer
#     on others), memcheck on the registered path.
#   usage: OUT=/dir bash scripts/gpu/nccl_register_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-560}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
echo "nccl ${nccl_root:-system}" | tee -a "$SUMMARY"
build_step 200
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
NET="sh -c"
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nccl $SHAPE -t 4096 -w 5 -n 30"
PICK4='^ +4096 \||registered'
NPICK=6 PICK="$PICK4" step bench_registered 30 $MPI2 -x MOE_EP_LOG=info $TOOL $B --zero-copy-combine
NPICK=4 PICK="$PICK4" step bench_register_off 30 $MPI2 -x MOE_EP_NCCL_REGISTER=0 $TOOL $B --zero-copy-combine
NPICK=4 PICK="$PICK4" step bench_registered_again 30 $MPI2 $TOOL $B --zero-copy-combine
NPICK=4 PICK="$PICK4" step bench_no_view 30 $MPI2 $TOOL $B
NPICK=4 PICK="$PICK4" step bench_registered_graph 30 $MPI2 $TOOL $B --zero-copy-combine --graph
step check_nccl_registered 120 $MPI2 $TOOL check --backend nccl --zero-copy-combine
nvlink_suites 120 nccl_gpu_np2 nccl_gpu_specific_np2 nccl_gpu_pipelined_np2 nccl_gpu_network_np2
step memcheck_nccl_registered 90 $MPI2 compute-sanitizer --print-limit 20 --error-exitcode 3 --tool memcheck \
  --report-api-errors no $TOOL check --backend nccl --zero-copy-combine --filter basic --modes eager --rounds 1
step check_nccl_network_registered 120 $MPI2 $NET_ENV $NET \
  "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL check --backend nccl --zero-copy-combine"
NPICK=4 PICK="$PICK4" step bench_network_registered 60 $MPI2 $NET_ENV $NET \
  "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL $B --zero-copy-combine"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
