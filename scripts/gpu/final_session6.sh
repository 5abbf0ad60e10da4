#!/usr/bin/env bash
# The sixth session's last device call (2 GPUs): scripts/gpu/session_validation.sh
# (every GPU suite, check on both backends and both NCCL transports, the
# sanitizers, the NVLink bench with the copy-engine ceiling and NCCL in the
# same run: bench_graph.json), then the few-SM benches of the pull combine and
# dispatch (4096 tokens on 24, 16 and 8 SMs; 8 SMs with 3 and 4 producers; 512
# tokens on 16 SMs).
#   usage: OUT=/dir bash scripts/gpu/final_session6.sh [VALIDATION_BUDGET_S] [BENCH_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-final}
OUT=$OUT bash "$(dirname "$0")/session_validation.sh" "${1:-420}" > "$OUT/validation_stdout.txt" 2>&1
validation=$?
rm -f "$OUT/validation_stdout.txt"
BUDGET=${2:-100}
SUMMARY=$OUT/sms_summary.txt
source "$(dirname "$0")/steps.sh"
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph \
  --zero-copy-combine --no-baselines"
for sms in 24 16 8; do
  NPICK=1 PICK="^ +4096 \|" step "sms$sms" 25 $MPI2 $TOOL $B -t 4096 --num-sms $sms --json "$OUT/bench_sms$sms.json"
done
for producers in 3 4; do
  NPICK=1 PICK="^ +4096 \|" step "sms8_p$producers" 25 $MPI2 -x MOE_EP_PULL_PRODUCERS=$producers $TOOL $B -t 4096 --num-sms 8
done
NPICK=1 PICK="^ +512 \|" step sms16_t512 25 $MPI2 $TOOL $B -t 512 --num-sms 16
echo "validation exit $validation; benches exit $rc" | tee -a "$SUMMARY"
[ "$validation" -eq 0 ] && [ "$rc" -eq 0 ]
