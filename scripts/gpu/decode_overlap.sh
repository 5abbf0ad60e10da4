#!/usr/bin/env bash
# One device call (2 GPUs, nvidia-h200-x2) for the two measurements of
# `bench --decode-step` and `bench --overlap-gemm` (docs/conformance.md), in the
# DeepSeek shape (hidden 7168, bf16, top-8 of 256 experts, uniform routing):
#   decode_step_nvlink     dispatch -> stand-in expert -> combine in one CUDA graph,
#                          1, 8, 32, 128 tokens per rank, against the sum of its parts
#   decode_step_zero_copy  the same with --zero-copy-combine (the expert writes the view)
#   decode_step_nccl       the same on the NCCL backend (any GPU backend)
#   overlap_nvlink         4096 tokens per rank, num_sms 16, beside a cuBLAS bf16 GEMM
#                          (N = K = 8192, M sized to match dispatch + combine), and
#                          beside an 8192 x 8192 x 8192 GEMM
# Every run checks its results against the oracle (#wrong must be 0).  The tool
# is built (only it) into build-final (up to 300 s); the measurements then get
# BUDGET_S seconds in all (default 90), the later steps being cut first.
#   usage: OUT=/dir [DEPS=prefix] bash scripts/gpu/decode_overlap.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
DEPS=${DEPS:-$PWD/.device-deps/usr}
BUDGET=300  # the build's; the measurements' is set after it
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo copy)" | tee -a "$SUMMARY"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"

PICK="overlap-gemm|error:|FAILED" step build 300 bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='$DEPS' && ninja -C $BUILD -j32 moe_ep_conformance"
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
START=$(date +%s)
BUDGET=${1:-90}
export PICK='^ +[0-9]+ \||^# +(stand-in expert|GEMM:)|^# overlap|Out of bounds|skipped|error|Error' NPICK=12
BENCH=(mpirun -np 2 --bind-to none $BUILD/tools/moe_ep_conformance bench --hidden 7168 --topk 8 --experts 256
       --dtype bf16 --routing uniform -G --timeout-ms 10000)

step decode_step_nvlink 25 "${BENCH[@]}" --backend nvlink --decode-step -t 1,8,32,128 -w 10 -n 50 \
  -J "$OUT/decode_step_nvlink.json"
step decode_step_zero_copy 20 "${BENCH[@]}" --backend nvlink --decode-step --zero-copy-combine -t 1,8,32,128 \
  -w 10 -n 50 -J "$OUT/decode_step_zero_copy.json"
step overlap_nvlink 30 "${BENCH[@]}" --backend nvlink --overlap-gemm --num-sms 16 -t 4096 -w 5 -n 20 \
  -J "$OUT/overlap_nvlink.json"
step overlap_nvlink_8192 20 "${BENCH[@]}" --backend nvlink --overlap-gemm --num-sms 16 -t 4096 -w 5 -n 20 \
  --gemm-mnk 8192,8192,8192 -c 0 -J "$OUT/overlap_nvlink_8192.json"
step decode_step_nccl 25 "${BENCH[@]}" --backend nccl --decode-step -t 1,8,32,128 -w 10 -n 50 \
  -J "$OUT/decode_step_nccl.json"
echo "measurements $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
