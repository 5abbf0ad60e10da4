#!/usr/bin/env bash
# Seventh session, one GPU (two-GPU machines were withheld): the pull's
# consumers summing a token's two 16-bit partials with packed adds (v22).
# Correctness: float_convert_gpu (every pair of bf16 and of fp16 inputs),
# every NVLink GPU suite (the new special-values case among them), check
# --zero-copy-combine on 2 and 4 ranks, memcheck and racecheck on
# [zero_copy].  Speed, as a proxy only: scripts/gpu/pull_proxy_bench.cpp (two
# ranks as two threads of one process on the one GPU, so their kernels run
# side by side; no NVLink) with this tree's library and with one whose pull
# kernel is $BASE_PULL (default .ab_base/combine_pull.cu, carried), alternated.
#   usage: OUT=/dir [CHECKS=0] bash scripts/gpu/sum_two_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-420}
BUILD=${BUILD:-build-final}
BASE_PULL=${BASE_PULL:-.ab_base/combine_pull.cu}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
CHECKS=${CHECKS:-1}  # 0: the proxy benches only
if [ "$CHECKS" = 1 ]; then
  build_step 150 moe_ep moe_ep_conformance test_nvlink_gpu moe_ep_kill_peer_probe test_float_convert
else
  build_step 150 moe_ep
fi
proxy_build "$PWD/$BUILD" /tmp/proxy_new > "$OUT/proxy_build.log" 2>&1 && echo "proxy_build: ok" | tee -a "$SUMMARY"
# The base library builds in the background while the checks run.
rm -rf /tmp/base && mkdir -p /tmp/base
tar --exclude=./build-final --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/base
cp "$BASE_PULL" /tmp/base/cuda/combine_pull.cu
(cd /tmp/base && cmake -S . -B build-base -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH=$PWD/.device-deps/usr && ninja -C build-base -j16 moe_ep && proxy_build /tmp/base/build-base \
  /tmp/proxy_base) > "$OUT/base_build.log" 2>&1 &
base_pid=$!
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
if [ "$CHECKS" = 1 ]; then
  nvlink_suites 90 float_convert_gpu $(cd $BUILD && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: \(nvlink_gpu[a-z0-9_]*\)$/\1/p')
  step check_zero_copy_np2 60 $MPI2 $TOOL check --backend nvlink --zero-copy-combine
  step check_zero_copy_np4 90 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nvlink --zero-copy-combine
  step memcheck_zero_copy 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[zero_copy]"
  step racecheck_zero_copy 120 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
fi
wait $base_pid && echo "base_build: ok" | tee -a "$SUMMARY" || { echo "base_build: FAILED" | tee -a "$SUMMARY"; tail -20 "$OUT/base_build.log"; }
for sms in 8 16 24 32; do
  for round in 1 2; do
    for tree in base new; do
      [ -x /tmp/proxy_$tree ] || continue
      NPICK=1 PICK="^proxy" step "proxy_${tree}_sms${sms}_$round" 30 /tmp/proxy_$tree 4096 $sms 5 30
    done
  done
done
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
