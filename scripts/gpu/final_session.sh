#!/usr/bin/env bash
# The session's last device call (2 GPUs): scripts/gpu/session_validation.sh
# (every GPU suite, check on both backends and both NCCL transports, the trust
# checks, compute-sanitizer, a short NVLink bench), then two benches of the
# final tree with their baselines in the same run: NVLink with the zero-copy
# pull combine at 1, 128, 512 and 4096 tokens (graph), and the NCCL backend at
# 4096 tokens over NVLink next to NCCL's own send/recv (eager).
#   usage: OUT=/dir [PULL_COMPARE=N] [FINAL_BUDGET=S] bash scripts/gpu/final_session.sh [VALIDATION_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
bash "$(dirname "$0")/session_validation.sh" "${1:-330}" > "$OUT/validation_stdout.txt" 2>&1
validation=$?
BUDGET=${FINAL_BUDGET:-150}
SUMMARY=$OUT/final_summary.txt
source "$(dirname "$0")/steps.sh"
if [ -z "${MOE_EP_NCCL_LIBRARY:-}" ] && [ -n "${nccl_root:-}" ]; then export MOE_EP_NCCL_LIBRARY="$nccl_root/lib/libnccl.so.2"; fi
TOOL=build-final/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
[ -n "${MOE_EP_NCCL_LIBRARY:-}" ] && MPI2="$MPI2 -x MOE_EP_NCCL_LIBRARY -x LD_LIBRARY_PATH"
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
NPICK=12 PICK="^ +[0-9]+ \|" step bench_nvlink_pull 60 $MPI2 $TOOL bench --backend nvlink $SHAPE -t 1,128,512,4096 \
  -w 10 -n 50 --graph --zero-copy-combine -J "$OUT/bench_final_pull.json"
NPICK=4 PICK="^ +4096 \|" step bench_nccl 50 $MPI2 $TOOL bench --backend nccl $SHAPE -t 4096 -w 5 -n 30 \
  -J "$OUT/bench_final_nccl.json"
NPICK=6 PICK="^ +4096 \||rank 0: (dispatch|combine)" step bench_nccl_profile 40 $MPI2 -x MOE_EP_NCCL_PROFILE=1 \
  -x MOE_EP_LOG=info $TOOL bench --backend nccl $SHAPE -t 4096 -w 5 -n 30
for sms in 24 16 8; do
  NPICK=2 PICK="^ +[0-9]+ \|" step "bench_pull_sms$sms" 20 $MPI2 $TOOL bench --backend nvlink $SHAPE -t 512,4096 \
    -w 10 -n 40 --graph --zero-copy-combine --no-baselines --num-sms $sms
done
# PULL_COMPARE=N: the same SM budgets (and all SMs) with N producer warps in the pull, for comparison.
for sms in ${PULL_COMPARE:+24 16 8 0}; do
  NPICK=2 PICK="^ +[0-9]+ \|" step "bench_pull_sms${sms}_p$PULL_COMPARE" 20 $MPI2 -x MOE_EP_PULL_PRODUCERS=$PULL_COMPARE \
    $TOOL bench --backend nvlink $SHAPE -t 512,4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines --num-sms $sms
done
echo "session_validation exit $validation; final benches exit $rc" | tee -a "$SUMMARY"
[ "$validation" -eq 0 ] && [ "$rc" -eq 0 ]
