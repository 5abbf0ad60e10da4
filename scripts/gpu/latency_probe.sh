#!/usr/bin/env bash
# One device call for the latency budget (docs/latency_budget.md): build only
# moe_ep_latency_probe (no libmoe_ep; Release, sm_90, into build-final) and
# run it once with --json (every group, the calls timed as the benchmark
# times them included); with two GPUs, once more with both sides on GPU 0
# (--same-gpu) for the local figures.  Under a minute in all; every wait in
# the probe is bounded, and every step here by `timeout`.
#   usage: OUT=/dir bash scripts/gpu/latency_probe.sh [extra probe arguments]   (from the repository root)
#   writes: $OUT/latency.json, latency.txt (table), latency.err (progress),
#           latency_same_gpu.{json,txt,err}, build.log, gpus.txt, summary.txt
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-final}
# CLI11, Catch2 and dlpack for the project's configure step (the probe needs none of them): .device-deps/ here,
# or beside this tree when it is a copy inside the main checkout.
DEPS=${DEPS:-$PWD/.device-deps/usr}
[ -d "$DEPS" ] || [ ! -d "$PWD/../.device-deps/usr" ] || DEPS=$(cd "$PWD/../.device-deps/usr" && pwd)
PROBE=$BUILD/tools/latency_probe/moe_ep_latency_probe
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/gpus.txt" 2>&1
GPUS=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')
note "commit $(git rev-parse --short HEAD 2> /dev/null || echo copy), $GPUS GPU(s)"

if ! { timeout -k 5 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
         -DCMAKE_PREFIX_PATH="$DEPS" && \
       timeout -k 5 180 ninja -C "$BUILD" -j32 moe_ep_latency_probe; } > "$OUT/build.log" 2>&1; then
  note "build: FAILED after $(( $(date +%s) - START )) s (tail of $OUT/build.log below)"
  tail -30 "$OUT/build.log"
  exit 1
fi
note "build: ok in $(( $(date +%s) - START )) s"

rc=0
# run NAME ARGS...: the probe once, table to NAME.txt, progress and errors to NAME.err.
run() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  timeout -k 5 120 "$PROBE" --json "$OUT/$name.json" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err"
  local s=$?
  note "$name: exit $s in $(( $(date +%s) - t0 )) s"
  cat "$OUT/$name.txt"
  [ "$s" -eq 0 ] || { rc=1; tail -20 "$OUT/$name.err"; }
}
run latency "$@"
if [ "$GPUS" -ge 2 ]; then
  run latency_same_gpu --same-gpu --only flag,row,ll,load,call "$@"
fi
note "total $(( $(date +%s) - START )) s, exit $rc"
exit $rc
