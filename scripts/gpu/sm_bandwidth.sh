#!/usr/bin/env bash
# One device call (one or two GPUs) for the per-SM bandwidth
# (docs/latency_budget.md, "Per-SM bandwidth"): build only
# moe_ep_latency_probe (no libmoe_ep; Release, sm_90, into build-final) and
# run its group bw once: register and bulk-copy streams, local and into or
# from the peer (both GPUs at once), for 1, 4, 8, 16, 24 and all SMs.  About
# a minute, most of it the build; every wait in the probe is bounded, and
# every step here by `timeout`.
#   usage: OUT=/dir bash scripts/gpu/sm_bandwidth.sh [extra probe arguments]   (from the repository root)
#   writes: $OUT/bw.json, bw.txt (the table), summary.txt, logs.txt (build and progress), gpus.txt
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${BUDGET:-170}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
# CLI11, Catch2 and dlpack for the project's configure step (the probe needs none of them): .device-deps/ here,
# or beside this tree when it is a copy inside the main checkout.
DEPS=${DEPS:-$PWD/.device-deps/usr}
[ -d "$DEPS" ] || [ ! -d "$PWD/../.device-deps/usr" ] || DEPS=$(cd "$PWD/../.device-deps/usr" && pwd)
PROBE=$BUILD/tools/latency_probe/moe_ep_latency_probe

{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/gpus.txt" 2>&1
PICK="Linking|error" step build 120 bash -c "cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='$DEPS' && ninja -C '$BUILD' -j32 moe_ep_latency_probe"
# The table to bw.txt; the probe's progress and errors into the step's log.
PICK="FAILED|exit" step bw 45 bash -c '"$0" --only bw --json "$1" "${@:3}" > "$2"' "$PROBE" "$OUT/bw.json" \
  "$OUT/bw.txt" "$@"
[ -s "$OUT/bw.txt" ] && cat "$OUT/bw.txt"
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
