#!/usr/bin/env bash
# What the seventh session could not run (its two-GPU machines were withheld),
# for the first two-GPU call after it: scripts/gpu/session_validation.sh (every
# GPU suite, NCCL ones and the new special-values case among them; check on
# both backends and both NCCL transports; the sanitizers; the NVLink bench of
# every size with the copy-engine ceiling and NCCL: bench_graph.json), then
# the few-SM benches that v22 (packed sums in the pull) and v23 (bulk dispatch
# rows by default on at most 8 SMs) predict: 4096 tokens on 24, 16 and 8 SMs,
# and on 8 SMs with the register dispatch (MOE_EP_DISPATCH_BULK=0) for the A/B.
#   usage: OUT=/dir bash scripts/gpu/session7_x2_check.sh [VALIDATION_BUDGET_S] [BENCH_BUDGET_S]
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
NPICK=1 PICK="^ +4096 \|" step sms8_dispatch_registers 25 $MPI2 -x MOE_EP_DISPATCH_BULK=0 $TOOL $B -t 4096 --num-sms 8
echo "validation exit $validation; benches exit $rc" | tee -a "$SUMMARY"
[ "$validation" -eq 0 ] && [ "$rc" -eq 0 ]
