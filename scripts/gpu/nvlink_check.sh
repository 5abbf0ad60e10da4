#!/usr/bin/env bash
# One device call: build the NVLink backend, run its GPU tests with 1 and 2
# ranks, and time dispatch/combine (hidden 7168, bf16, top-8 of 256, 2 ranks,
# 4096 and 128 tokens per rank).  Logs go to $OUT (or ./gpu-out).
#   usage: scripts/gpu/nvlink_check.sh [tests|timing|all] [extra ctest args]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0
BUILD=build-device

{ nvidia-smi --query-gpu=index,name,memory.used,memory.total,clocks.sm --format=csv; nvidia-smi topo -m; } \
  > "$OUT/machine.txt" 2>&1

echo "== build"
start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$OUT/build.log" 2>&1 &&
  ninja -C $BUILD -j32 test_nvlink_host test_nvlink_gpu moe_ep_conformance >> "$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit $rc; fi

status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  echo "== tests"
  shift || true
  (cd $BUILD && ctest -R 'nvlink' -V --timeout 200 "$@") > "$OUT/ctest.log" 2>&1
  status=$?
  grep -E "tests passed|Test +#|All tests passed|test cases|FAILED|Failed|SKIPPED|Skipped|skipping|timeout" "$OUT/ctest.log" | tail -25
  [ $status -ne 0 ] && grep -B5 -A30 -E "FAILED|REQUIRE|with expansion" "$OUT/ctest.log" | head -120
fi

if [ "$what" = timing ] || [ "$what" = all ]; then
  echo "== timing"
  source "$(dirname "$0")/bench_times.sh"
  timing() {  # schedule tokens iterations [bench flags]
    BENCH_MPI_FLAGS=(-x MOE_EP_COMBINE_SCHEDULE=$1)
    echo "schedule $1 tokens $2: $(bench_times $BUILD "${@:2}")"
  }
  BENCH_MPI_FLAGS=(-x MOE_EP_LOG=info)
  bench_times $BUILD 128 20 > /dev/null
  grep "^\[moe_ep\]" "$OUT/timing.log" | sort -u
  for t in 4096 128 1; do timing auto $t 200; done
  timing auto 4096 100 --num-sms 16
  timing serial 4096 100
fi
exit $status
