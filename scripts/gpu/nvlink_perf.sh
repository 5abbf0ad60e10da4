#!/usr/bin/env bash
# One device call for performance work on the NVLink backend: builds this tree
# (and, when .perf-base/ holds an older source tree, that one's
# moe_ep_conformance as the baseline of the same run), times combine/dispatch
# variants with `moe_ep_conformance bench`, then runs the GPU tests.  Logs go
# to $OUT (or ./gpu-out).
#   usage: scripts/gpu/nvlink_perf.sh
# Variants are environment settings of the library:
#   MOE_EP_COMBINE_SCHEDULE=serial|overlapped|auto, MOE_EP_COMBINE_PHASES=n,
#   MOE_EP_COMBINE_REDUCE_BLOCKS=n
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0
deps="$PWD/.device-deps/usr"
start=$(date +%s)
echo "== build"
{ cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="$deps" &&
  ninja -C build-device -j24 test_nvlink_host test_nvlink_gpu moe_ep_conformance; } > "$OUT/build.log" 2>&1 &
new=$!
base_ok=0
if [ -d .perf-base ]; then
  { cmake -S .perf-base -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$deps" &&
    ninja -C build-base -j8 moe_ep_conformance; } > "$OUT/build-base.log" 2>&1 && base_ok=1
fi
wait $new; rc=$?
echo "build rc=$rc base=$base_ok in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then tail -30 "$OUT/build.log"; exit $rc; fi

echo "== timing"
source "$(dirname "$0")/bench_times.sh"
t() {  # label build env... -- tokens iterations [bench flags]
  local label=$1 build=$2; shift 2
  BENCH_MPI_FLAGS=(); while [ "$1" != "--" ]; do BENCH_MPI_FLAGS+=("-x" "$1"); shift; done; shift
  echo "$label | $(bench_times $build "$@")"
}
if [ $base_ok = 1 ]; then
  t "base 4096" build-base -- 4096 200
  t "base 4096 16 SMs" build-base -- 4096 100 --num-sms 16
fi
t "new 4096" build-device -- 4096 200
t "new 128" build-device -- 128 200
t "new 1" build-device -- 1 200
t "new 4096 16 SMs" build-device -- 4096 100 --num-sms 16
t "new serial 4096" build-device MOE_EP_COMBINE_SCHEDULE=serial -- 4096 200
t "new ovl K32 4096" build-device MOE_EP_COMBINE_SCHEDULE=overlapped MOE_EP_COMBINE_PHASES=32 -- 4096 200
t "new ovl K16 R72 4096" build-device MOE_EP_COMBINE_SCHEDULE=overlapped MOE_EP_COMBINE_REDUCE_BLOCKS=72 -- 4096 200
echo "timing done at $(( $(date +%s) - start )) s"

echo "== tests"
(cd build-device && ctest -R 'nvlink' --timeout 150 -j1) > "$OUT/ctest.log" 2>&1
status=$?
grep -E "Test +#|tests passed|tests failed" "$OUT/ctest.log"
[ $status -ne 0 ] && (cd build-device && ctest -R nvlink --rerun-failed -V --timeout 150 2>&1 | grep -B5 -A25 -E "FAILED|REQUIRE|with expansion" | head -80)
echo "all done at $(( $(date +%s) - start )) s"
exit $status
