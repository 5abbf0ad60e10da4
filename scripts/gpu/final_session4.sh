#!/usr/bin/env bash
# The fourth session's last device call (2 GPUs): scripts/gpu/final_session.sh
# (every GPU suite, check on both backends and both NCCL transports, the
# sanitizers, the final NVLink and NCCL benches and the few-SM pull), then
# the NCCL dispatch with its metadata never joined to the rows
# (MOE_EP_NCCL_JOIN_METADATA=0) between two runs of the default in the same
# call, check with it, the NCCL bench on NCCL's socket transport, the pull
# with 3 producers on 16 SMs, and last Nsight Compute on the pull at 16 SMs
# (scripts/gpu/pull_profile.sh) for the next step.  At most 8 files come back:
# the summaries, logs.txt, the two final bench JSONs and the profile's texts.
#   usage: OUT=/dir bash scripts/gpu/final_session4.sh [VALIDATION_BUDGET_S] [EXTRA_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
FINAL_BUDGET=${FINAL_BUDGET:-90} OUT=$OUT bash "$(dirname "$0")/final_session.sh" "${1:-300}" > /tmp/final_stdout.txt 2>&1
final=$?
BUDGET=${2:-110}
SUMMARY=$OUT/extra_summary.txt
source "$(dirname "$0")/steps.sh"
TOOL=build-final/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nccl $SHAPE -t 4096 -w 5 -n 30"
NPICK=4 PICK="^ +4096 \|" step bench_nccl_joined 25 $MPI2 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_separate 25 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL $B
NPICK=4 PICK="^ +4096 \|" step bench_nccl_joined_again 25 $MPI2 $TOOL $B
step check_nccl_separate 40 $MPI2 -x MOE_EP_NCCL_JOIN_METADATA=0 $TOOL check --backend nccl --filter basic
NPICK=4 PICK="^ +4096 \|" step bench_nccl_network 40 $MPI2 $NET_ENV sh -c \
  "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL $B"
NPICK=2 PICK="^ +[0-9]+ \|" step bench_pull_sms16_p3 20 $MPI2 -x MOE_EP_PULL_PRODUCERS=3 $TOOL bench --backend nvlink \
  $SHAPE -t 4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines --num-sms 16
mkdir -p "$OUT/prof"
OUT=$OUT/prof bash "$(dirname "$0")/pull_profile.sh" 100 > /dev/null 2>&1
cat "$OUT/prof/summary.txt" >> "$SUMMARY"
mv "$OUT/prof/pull_r0.txt" "$OUT/prof/pull_r0_source.txt" "$OUT/" 2> /dev/null
rm -rf "$OUT/prof" "$OUT/bench_graph.json" "$OUT/validation_stdout.txt"
echo "final_session exit $final; extra exit $rc" | tee -a "$SUMMARY"
[ "$final" -eq 0 ] && [ "$rc" -eq 0 ]
