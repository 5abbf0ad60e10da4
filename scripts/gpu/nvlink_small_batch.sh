#!/usr/bin/env bash
# One device call (nvidia-h200-x2, .device-deps/ carried) for the small-batch
# kernels: build everything, time 1, 128 and 4096 tokens per rank with the
# general kernels (MOE_EP_SMALL_BATCH=0) and with the new default, alternating,
# then the whole GPU suite and the NVLink tests.  Logs in $OUT/logs.tar.gz,
# summary in $OUT/summary.log.
#   usage: OUT=/some/dir bash scripts/gpu/nvlink_small_batch.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
L=$(mktemp -d)/logs
mkdir -p "$OUT" "$L"
S=$OUT/summary.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
B=build-small
finish() { tar czf "$OUT/logs.tar.gz" -C "$(dirname "$L")" logs; }
trap finish EXIT
start=$(date +%s)
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee -a "$S"
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$L/build.log" 2>&1 && ninja -C $B -j32 >> "$L/build.log" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$S"
[ $rc -eq 0 ] || { tail -40 "$L/build.log" | tee -a "$S"; exit 1; }

source "$(dirname "$0")/bench_times.sh"
broken=0
t() {  # label small(0|1) tokens; after a failure the remaining timings are skipped (the tests still run)
  [ $broken -eq 0 ] || return
  local line
  BENCH_MPI_FLAGS=(-x MOE_EP_SMALL_BATCH=$2)
  line=$(OUT=$L bench_times $B $3 200)
  [[ "$line" == *"wrong 0/0"*"wrong 0/0"* ]] || broken=1
  echo "$1 tokens $3 | $line" | tee -a "$S"
}
for round in 1 2; do
  for tok in 1 128; do t old 0 $tok; t new 1 $tok; done
done
t old 0 4096; t new 1 4096
echo "timing done at $(( $(date +%s) - start )) s" | tee -a "$S"

(cd $B && ctest -L gpu -j1 --output-on-failure --timeout 100) > "$L/ctest_gpu.log" 2>&1
g=$?
grep -E "Test +#|tests passed|tests failed|Total Test" "$L/ctest_gpu.log" | tee -a "$S"
(cd $B && ctest -R nvlink -j1 --output-on-failure --timeout 100) > "$L/ctest_nvlink.log" 2>&1
n=$?
grep -E "Test +#|tests passed|tests failed|Total Test" "$L/ctest_nvlink.log" | tee -a "$S"
[ $g -ne 0 ] || [ $n -ne 0 ] && grep -B3 -A25 -E "FAILED|REQUIRE|with expansion" "$L"/ctest_*.log | head -80 | tee -a "$S"
echo "ctest gpu: exit $g, ctest nvlink: exit $n; all done at $(( $(date +%s) - start )) s" | tee -a "$S"
exit $(( g != 0 || n != 0 ))
