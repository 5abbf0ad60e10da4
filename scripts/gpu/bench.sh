#!/usr/bin/env bash
# The published benchmark (docs/performance.md, docs/bench_h200x2.json) on a
# machine with 2 NVLink-connected GPUs, from the repository root:
#   bash scripts/gpu/bench.sh            the conformance check on 2 ranks, then
#       the DeepSeek shape (hidden 7168, bf16, top-8 of 256 experts, uniform
#       routing) at 1, 128, 512 and 4096 tokens per rank, CUDA-graph replays,
#       zero-copy combine, with the copy-engine ceiling and NCCL in the same
#       run ($OUT/bench.json); 4096 tokens on 24, 16 and 8 SMs
#       ($OUT/bench_smsN.json); the plot ($OUT/bench.png, tools/plot_bench.py,
#       where matplotlib is installed); and the times against the published
#       JSON, in per cent.
#   bash scripts/gpu/bench.sh latency [ARG...]   moe_ep_latency_probe (every
#       probe, GPU 0 and GPU 1, then both sides on one GPU) into
#       $OUT/latency.json and $OUT/latency_same_gpu.json (docs/latency_budget.md).
#   bash scripts/gpu/bench.sh bw [ARG...]   moe_ep_latency_probe --only bw: GB/s
#       per GPU and per SM ($OUT/bw.json).
#   bash scripts/gpu/bench.sh formats   the receive layouts and the wire formats
#       in the DeepSeek shape at 128 and 4096 tokens per rank, CUDA-graph
#       replays: bench --layout all (alignment 128, expert_rows 40960) into
#       $OUT/layouts.json, bench --wire all into $OUT/wire.json (the side-by-side
#       tables hold every ratio the targets name), the decode step with the
#       grouped-GEMM expert ($OUT/decode_grouped.json), and the NCCL backend's
#       --wire all ($OUT/wire_nccl.json).
# Settings: OUT, BUILD, DEPS, CUDA_ARCH, JOBS, BUDGET (scripts/gpu/steps.sh);
# TOKENS (default 1,128,512,4096), SMS (default "24 16 8", empty for none).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/steps.sh
what=${1:-bench}
[ $# -gt 0 ] && shift

if [ "$what" = latency ] || [ "$what" = bw ]; then
  build_step moe_ep_latency_probe
  PROBE=$BUILD/tools/latency_probe/moe_ep_latency_probe
  if [ "$what" = bw ]; then
    NPICK=40 PICK="." step bw 120 "$PROBE" --only bw --json "$OUT/bw.json" "$@"
  else
    NPICK=60 PICK="." step latency 180 "$PROBE" --json "$OUT/latency.json" "$@"
    NPICK=60 PICK="." step latency_same_gpu 180 "$PROBE" --same-gpu --only flag,row,ll,load,call \
      --json "$OUT/latency_same_gpu.json" "$@"
  fi
  finish
fi
if [ "$what" = formats ]; then
  build_step moe_ep_conformance
  TOOL=$BUILD/tools/moe_ep_conformance
  MPI2="mpirun -np 2 --bind-to none"
  F="bench --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform --graph -t 128,4096 -w 10 -n 40 --no-baselines"
  NPICK=12 PICK="^ +[0-9]+ " step layouts 240 $MPI2 $TOOL $F --backend nvlink --layout all --expert-alignment 128 \
    --json "$OUT/layouts.json"
  NPICK=12 PICK="^ +[0-9]+ " step wire 240 $MPI2 $TOOL $F --backend nvlink --wire all --json "$OUT/wire.json"
  NPICK=8 PICK="^ +[0-9]+ " step decode_grouped 180 $MPI2 $TOOL bench --backend nvlink --decode-step \
    --expert-gemm grouped --expert-alignment 128 -G --json "$OUT/decode_grouped.json"
  NPICK=12 PICK="^ +[0-9]+ " step wire_nccl 240 $MPI2 $TOOL $F --backend nccl --wire all --json "$OUT/wire_nccl.json"
  finish
fi
[ "$what" = bench ] || { echo "usage: bench.sh [bench | latency | bw | formats] [ARG...]" >&2; exit 2; }

build_step moe_ep_conformance
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform --graph --zero-copy-combine"
step check_nvlink 120 $MPI2 $TOOL check --backend nvlink
NPICK=12 PICK="^ +[0-9]+ |ceiling|nccl" step bench 180 $MPI2 $TOOL $B -t "${TOKENS:-1,128,512,4096}" -w 10 -n 50 \
  --json "$OUT/bench.json"
for n in ${SMS-24 16 8}; do
  NPICK=1 PICK="^ +4096 \|" step "sms$n" 60 $MPI2 $TOOL $B -t 4096 -w 10 -n 40 --no-baselines --num-sms "$n" \
    --json "$OUT/bench_sms$n.json"
done
if [ -s "$OUT/bench.json" ]; then
  if python3 -c "import matplotlib" 2> /dev/null; then
    PICK="." step plot 60 python3 tools/plot_bench.py "$OUT/bench.json" -o "$OUT/bench.png"
  else
    echo "plot: skipped (matplotlib is not installed)" | tee -a "$SUMMARY"
  fi
  [ -f docs/bench_h200x2.json ] && bench_compare published docs/bench_h200x2.json now "$OUT/bench.json" |
    tee -a "$SUMMARY"
fi
finish
