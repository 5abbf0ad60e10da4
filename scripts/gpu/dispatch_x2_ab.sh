#!/usr/bin/env bash
# For the first two-GPU call after the eighth and ninth sessions (whose
# two-GPU machines were withheld): do the dispatch changes measured only on
# the one-GPU proxy (v24-v25 block 0's share, v27 routing by look-back or by
# scan up to each block's last token, v28 the scan's smaller last block) help
# on 2 H200, where 16 SMs and more are bound by the link?  This tree's dispatch
# against the base commit's (.ab_base/: an export of 91f3915, the seventh
# session's final tree, carried beside the checkout), both release builds of
# the conformance tool, alternated twice: 4096 tokens on 8, 16, 24, 32 SMs and
# all SMs, and 512 tokens (graph, zero-copy, no baselines).  Then a
# -DMOE_EP_DIAGNOSTICS build's per-block phase times on 2 GPUs
# (MOE_EP_DISPATCH_DIAGNOSTIC=4, dispatch_trace.py; the two GPUs' timers are
# not aligned, so compare phases within a rank, not the ranks' starts): how
# long routing keeps the link idle when the link, not the SM, is the limit.
# Prepare the base: rm -rf .ab_base && mkdir .ab_base && git archive 91f3915 | tar -x -C .ab_base
#   usage: OUT=/dir bash scripts/gpu/dispatch_x2_ab.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
tool_build new "$PWD"
tool_build base "$PWD/.ab_base"
tool_build diag "$PWD" -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform --graph \
  --zero-copy-combine --no-baselines"
for round in 1 2; do
  for v in base new; do
    for sms in 8 16 24 32 0; do
      NPICK=1 PICK="^ +4096 \|" step "${v}_sms${sms}_$round" 25 $MPI2 "build-tool-$v/tools/moe_ep_conformance" $B \
        -w 10 -n 40 -t 4096 --num-sms $sms
    done
    NPICK=1 PICK="^ +512 \|" step "${v}_t512_$round" 25 $MPI2 "build-tool-$v/tools/moe_ep_conformance" $B -w 10 -n 40 -t 512
  done
done
for sms in 0 24 8; do
  NPICK=1 PICK="^ +4096 \|" step "trace_sms$sms" 25 $MPI2 -x MOE_EP_DISPATCH_DIAGNOSTIC=4 \
    build-tool-diag/tools/moe_ep_conformance $B -w 3 -n 1 -t 4096 --num-sms $sms
done
for f in "$STEP_LOG_DIR"/trace_*.log; do
  { echo "== $(basename "$f" .log)"; python3 "$(dirname "$0")/dispatch_trace.py" "$f"; } >> "$OUT/trace_summary.txt"
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
