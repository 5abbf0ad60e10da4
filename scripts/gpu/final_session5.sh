#!/usr/bin/env bash
# The fifth session's last device call (2 GPUs): the NCCL backend's speed with
# and without its workspace registered with NCCL, on NVLink and on NCCL's
# socket transport (registered, MOE_EP_NCCL_REGISTER=0, registered again,
# without the zero-copy view), each next to NCCL's own send/recv in the same
# run; then scripts/gpu/session_validation.sh (every GPU suite, check on both
# backends and both NCCL transports, the sanitizers, the NVLink bench) with
# what is left of the budget.  At most 8 files come back.
#   usage: OUT=/dir [ONLY=sockets] bash scripts/gpu/final_session5.sh [BENCH_BUDGET_S] [VALIDATION_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUDGET=${1:-130}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/nccl_summary.txt
source "$(dirname "$0")/steps.sh"
build_step 200 $([ "${ONLY:-}" = sockets ] && echo moe_ep_conformance)
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nccl $SHAPE -t 4096 -w 5 -n 30"
P='^ +4096 \|'
if [ "${ONLY:-}" != sockets ]; then
NPICK=2 PICK="$P" step nvlink_registered 30 $MPI2 $TOOL $B --zero-copy-combine --json "$OUT/bench_nccl_registered.json"
NPICK=2 PICK="$P" step nvlink_register_off 30 $MPI2 -x MOE_EP_NCCL_REGISTER=0 $TOOL $B --zero-copy-combine
NPICK=2 PICK="$P" step nvlink_registered_again 30 $MPI2 $TOOL $B --zero-copy-combine
NPICK=2 PICK="$P" step nvlink_no_view 30 $MPI2 $TOOL $B
fi
S="bench --backend nccl $SHAPE -t 4096 -w 2 -n 12"  # sockets: about 25 ms a call
for run in registered register_off registered_again no_view; do
  env_arg="" view="--zero-copy-combine"
  [ $run = register_off ] && env_arg="-x MOE_EP_NCCL_REGISTER=0"
  [ $run = no_view ] && view=""
  NPICK=2 PICK="$P" step "sockets_$run" 40 $MPI2 $NET_ENV $env_arg sh -c \
    "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL $S $view"
done
[ "${ONLY:-}" = sockets ] && { echo "sockets only: exit $rc" | tee -a "$SUMMARY"; exit $rc; }
OUT=$OUT bash "$(dirname "$0")/session_validation.sh" "${2:-430}" > "$OUT/validation_stdout.txt" 2>&1
validation=$?
rm -f "$OUT/validation_stdout.txt"
echo "validation exit $validation; nccl benches exit $rc" | tee -a "$SUMMARY"
[ "$validation" -eq 0 ] && [ "$rc" -eq 0 ]
