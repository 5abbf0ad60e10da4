#!/usr/bin/env bash
# What the seventh session could not run (its two-GPU machines were withheld),
# for the first two-GPU call after it: scripts/gpu/final_session6.sh (the
# whole validation, NCCL suites and the special-values case among them, the
# NVLink bench of every size with the ceiling and NCCL, and 4096 tokens on 24,
# 16 and 8 SMs, where v22 and v23 predict their gains), then the 8-SM dispatch
# with the register rows (MOE_EP_DISPATCH_BULK=0) for v23's A/B.
#   usage: OUT=/dir bash scripts/gpu/session7_x2_check.sh [VALIDATION_BUDGET_S] [BENCH_BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUILD=${BUILD:-build-final}
OUT=$OUT BUILD=$BUILD bash "$(dirname "$0")/final_session6.sh" "${1:-420}" "${2:-100}"
validation=$?
BUDGET=40
SUMMARY=$OUT/ab_summary.txt
source "$(dirname "$0")/steps.sh"
NPICK=1 PICK="^ +4096 \|" step sms8_dispatch_registers 30 mpirun -np 2 --bind-to none -x MOE_EP_DISPATCH_BULK=0 \
  $BUILD/tools/moe_ep_conformance bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 \
  --routing uniform -w 10 -n 40 --graph --zero-copy-combine --no-baselines -t 4096 --num-sms 8
[ "$validation" -eq 0 ] && [ "$rc" -eq 0 ]
