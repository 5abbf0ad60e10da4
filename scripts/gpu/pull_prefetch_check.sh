#!/usr/bin/env bash
# One device call (2 GPUs) for the whole-row pull with the producer's token
# slots fetched a batch ahead: build; the NVLink GPU suites; compute-sanitizer
# on [zero_copy]; the mbarrier release probe (racecheck: one arrival per warp
# after __syncwarp against every lane arriving; and the time of each); then
# bench, DeepSeek shape, graph, --zero-copy-combine, on all, 24, 16 and 8 SMs.
#   usage: OUT=/dir bash scripts/gpu/pull_prefetch_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-240}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
PICK="Linking|error:" step build 90 bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='$PWD/.device-deps/usr' && ninja -C $BUILD -j32 test_nvlink_gpu moe_ep_conformance"
PICK="error" step build_probe 40 nvcc -O3 -arch=sm_90 -o /tmp/mbarrier_probe scripts/gpu/mbarrier_release_probe.cu
SAN="compute-sanitizer --print-limit 4 --error-exitcode 3"
for mode in warp lanes; do
  step "racecheck_probe_$mode" 30 $SAN --tool racecheck /tmp/mbarrier_probe $mode 48 2
  NPICK=3 PICK="^mode" step "time_probe_$mode" 15 bash -c "/tmp/mbarrier_probe $mode 4096 16; /tmp/mbarrier_probe $mode 4096 132"
done
for t in nvlink_gpu_np2 nvlink_gpu_overlapped_np2 nvlink_gpu_overlapped_phases_np2 nvlink_gpu_general_kernels_np2; do
  step "ctest_$t" 40 ctest --test-dir $BUILD -R "^$t\$" --output-on-failure --timeout 35
done
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
for tool in memcheck synccheck racecheck; do
  step "${tool}_zero_copy" 45 mpirun -np 2 --bind-to none -x MOE_EP_FABRIC=0 $SAN --tool $tool $GPU_TEST "[zero_copy]"
done
TOOL=$BUILD/tools/moe_ep_conformance
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 40 --graph --zero-copy-combine"
NPICK=8 PICK="^ +[0-9]+ \|" step all_sms 30 mpirun -np 2 --bind-to none $TOOL $B -t 1,128,512,4096 -J "$OUT/bench_all.json"
for sms in 24 16 8; do
  NPICK=4 PICK="^ +[0-9]+ \|" step rows_sms$sms 20 mpirun -np 2 --bind-to none $TOOL $B --no-baselines -t 512,4096 --num-sms $sms
done
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
