#!/usr/bin/env bash
# Eleventh session, the first two-GPU call since the seventh (2 H200, NVLink),
# with what was left of the device time: build; the conformance check and the
# NVLink GPU suite on two GPUs; the bench of issue 10's targets in one run
# (DeepSeek shape, 1 / 128 / 512 / 4096 tokens, CUDA graph, zero-copy combine,
# the copy-engine ceiling and NCCL in the same run: bench_graph.json); 4096
# tokens on 24, 16 and 8 SMs (bench_sms*.json); the small-batch bounds (v32,
# v33) against the old ones at 192-512 tokens, with and without the view; the
# plot where matplotlib is there.
#   usage: OUT=/dir bash scripts/gpu/session11_x2.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-360}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT/steps
mkdir -p "$STEP_LOG_DIR"
source "$(dirname "$0")/steps.sh"
build_step 150 moe_ep moe_ep_mpi moe_ep_conformance test_nvlink_gpu
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform --graph"
step check_nvlink 60 $MPI2 $TOOL check --backend nvlink
step gpu_suite_np2 90 $MPI2 $BUILD/test/nvlink/test_nvlink_gpu
NPICK=12 PICK="^ +[0-9]+ |ceiling|nccl" step bench_graph 90 $MPI2 $TOOL $B -t 1,128,512,4096 -w 10 -n 50 \
  --zero-copy-combine --json "$OUT/bench_graph.json"
for sms in 24 16 8; do
  NPICK=1 PICK="^ +4096 \|" step "sms$sms" 30 $MPI2 $TOOL $B -t 4096 -w 10 -n 40 --zero-copy-combine --no-baselines \
    --num-sms $sms --json "$OUT/bench_sms$sms.json"
done
for round in 1 2; do
  for bound in 128 512; do
    NPICK=4 PICK="^ +[0-9]+ \|" step "bounds_view_b${bound}_$round" 30 $MPI2 -x MOE_EP_SMALL_DISPATCH_TOKENS=$bound \
      -x MOE_EP_SMALL_COMBINE_TOKENS=$bound $TOOL $B -t 192,256,384,512 -w 10 -n 100 --zero-copy-combine --no-baselines
    NPICK=4 PICK="^ +[0-9]+ \|" step "bounds_push_b${bound}_$round" 30 $MPI2 -x MOE_EP_SMALL_DISPATCH_TOKENS=$bound \
      -x MOE_EP_SMALL_COMBINE_TOKENS=$bound $TOOL $B -t 192,256,384,512 -w 10 -n 100 --no-baselines
  done
done
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 tools/plot_bench.py "$OUT"/bench_graph.json -o "$OUT/bench_h200x2_session11.png" >> "$OUT/plot.log" 2>&1 ||
    echo "plot failed" | tee -a "$SUMMARY"
fi
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
