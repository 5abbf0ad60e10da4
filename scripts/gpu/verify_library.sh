#!/usr/bin/env bash
# One device call (nvidia-h200-x2, .device-deps/ carried) that validates the
# verification library (verify/) on GPUs: builds everything, runs every GPU
# CTest suite, `moe_ep_conformance check` on the nvlink backend (eager and
# graph modes) with 1 and 2 ranks, and bench (eager and graph) at 1, 128 and
# 4096 tokens per rank.  Logs and a summary in $OUT.
#   usage: OUT=/some/dir bash scripts/gpu/verify_library.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
S=$OUT/summary.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
B=build-verify
start=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$OUT/build.log" 2>&1 && ninja -C $B -j32 >> "$OUT/build.log" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$S"
[ $rc -eq 0 ] || { tail -40 "$OUT/build.log" | tee -a "$S"; exit 1; }

(cd $B && ctest -L gpu -j1 --output-on-failure --timeout 200) > "$OUT/ctest_gpu.log" 2>&1
g=$?
grep -E "Test +#|tests passed|tests failed" "$OUT/ctest_gpu.log" | tee -a "$S"

c=0
for np in 1 2; do
  timeout 300 mpirun -np $np --bind-to none $B/tools/moe_ep_conformance check --backend nvlink --modes both \
    > "$OUT/check_np$np.log" 2>&1 || c=1
  grep -E "WRONG|ERROR|Out of bounds|passed" "$OUT/check_np$np.log" | tee -a "$S"
done

source "$(dirname "$0")/bench_times.sh"
for t in 1 128 4096; do echo "bench tokens $t | $(bench_times $B $t 100)" | tee -a "$S"; done
timeout 300 mpirun -np 2 --bind-to none $B/tools/moe_ep_conformance bench --backend nvlink -b 1 -e 4096 -f 8 \
  -J "$OUT/bench.json" > "$OUT/bench.log" 2>&1 || c=1
tail -4 "$OUT/bench.log" | tee -a "$S"
echo "ctest gpu: exit $g, check/bench: $c; done in $(( $(date +%s) - start )) s" | tee -a "$S"
exit $(( g != 0 || c != 0 ))
