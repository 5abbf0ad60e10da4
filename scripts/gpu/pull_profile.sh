#!/usr/bin/env bash
# One device call (2 GPUs) prepared for the next step of the few-SM combine:
# Nsight Compute on rank 0's whole-row pull kernel (combine_pull_kernel) at
# $SMS SMs (default 16), 4096 tokens, DeepSeek shape, --zero-copy-combine, CUDA graph; rank 1
# runs the same bench unprofiled.  The protocol keeps rank 1's view valid while
# rank 0's kernel is replayed (a peer rewrites its view only after this rank's
# next dispatch), and every wait is bounded by --timeout-ms.  Writes
# $OUT/pull_r0.ncu-rep and a text summary (stall reasons, memory throughput).
# $OUT/pull_r0_sass.csv keeps every SASS line with its counters.
#   usage: OUT=/dir [SMS=16] bash scripts/gpu/pull_profile.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-200}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 90 moe_ep_conformance
TOOL=$PWD/$BUILD/tools/moe_ep_conformance
BENCH="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 5 -n 10 \
  --graph --no-baselines --zero-copy-combine --num-sms ${SMS:-16} --timeout-ms 120000"
NCU="ncu --kernel-name regex:combine_pull --launch-skip 8 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SourceCounters --section LaunchStats --section Occupancy --clock-control none \
  --target-processes all -f -o $OUT/pull_r0"
NPICK=6 PICK="^ +4096 \||==PROF==|error" step profile 150 mpirun -np 2 --bind-to none sh -c \
  "if [ \"\$OMPI_COMM_WORLD_RANK\" = 0 ]; then exec $NCU $TOOL $BENCH; else exec $TOOL $BENCH; fi"
if [ -f "$OUT/pull_r0.ncu-rep" ]; then
  ncu --import "$OUT/pull_r0.ncu-rep" --page details --print-details all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SourceCounters \
    --section LaunchStats --section Occupancy > "$OUT/pull_r0.txt" 2>&1
  ncu --import "$OUT/pull_r0.ncu-rep" --page source --csv --print-source sass > "$OUT/pull_r0_sass.csv" 2> /dev/null
  python3 "$(dirname "$0")/ncu_source_top.py" < "$OUT/pull_r0_sass.csv" > "$OUT/pull_r0_source.txt" 2>&1
fi
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
