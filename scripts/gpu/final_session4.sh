#!/usr/bin/env bash
# The fourth session's last device call (2 GPUs): scripts/gpu/final_session.sh
# (every GPU suite, check on both backends and both NCCL transports, the
# sanitizers, the final NVLink and NCCL benches and the few-SM pull), then
# the NCCL dispatch with its metadata never joined to the rows
# (MOE_EP_NCCL_JOIN_METADATA=0) next to the default in the same call, check
# with it, and the NCCL bench on NCCL's socket transport.
#   usage: OUT=/dir bash scripts/gpu/final_session4.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
OUT=$OUT bash "$(dirname "$0")/final_session.sh" "${1:-330}" > "$OUT/final_stdout.txt" 2>&1
final=$?
BUDGET=${2:-120}
SUMMARY=$OUT/extra_summary.txt
source "$(dirname "$0")/steps.sh"
TOOL=build-final/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
B="bench --backend nccl --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 5 -n 30"
NPICK=4 PICK="^ +4096 \|" step bench_nccl_joined 30 $MPI2 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_separate 30 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_joined_again 30 $MPI2 $TOOL $B
step check_nccl_separate 60 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL check --backend nccl --filter basic
NPICK=4 PICK="^ +4096 \|" step bench_nccl_network 60 $MPI2 $NET_ENV sh -c \
  "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL $B -J $OUT/bench_nccl_network.json"
echo "final_session exit $final; extra exit $rc" | tee -a "$SUMMARY"
[ "$final" -eq 0 ] && [ "$rc" -eq 0 ]
