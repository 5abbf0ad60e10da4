#!/usr/bin/env bash
# One device call for the zero-copy combine input (config.zero_copy_combine):
# builds, runs the GPU suite's zero-copy case on both GPU backends (2 ranks),
# the conformance check cases on both, and a short bench with and without
# --zero-copy-combine (NVLink, hidden 7168, bf16, top-8 of 256, 128 and 4096
# tokens).  Run from the repository root; logs go to $OUT (or ./gpu-out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
BUILD=build-device
MPI=(mpirun -np 2 --bind-to none)

cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$OUT/build.log" 2>&1 &&
  ninja -C $BUILD -j32 test_nvlink_gpu moe_ep_conformance >> "$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; exit 1; }

status=0
for backend in nvlink nccl; do
  echo "== GPU suite, zero-copy case, $backend"
  MOE_EP_TEST_GPU_BACKEND=$backend "${MPI[@]}" -x MOE_EP_TEST_GPU_BACKEND \
    $BUILD/test/nvlink/test_nvlink_gpu "[zero_copy]" > "$OUT/gpu_suite_$backend.log" 2>&1 || status=1
  tail -4 "$OUT/gpu_suite_$backend.log"
  echo "== conformance check, zero-copy cases, $backend"
  "${MPI[@]}" $BUILD/tools/moe_ep_conformance check --backend $backend --filter zero_copy \
    > "$OUT/check_$backend.log" 2>&1 || status=1
  tail -4 "$OUT/check_$backend.log"
done
for flag in "" --zero-copy-combine; do
  echo "== bench nvlink ${flag:-(copy)}"
  "${MPI[@]}" $BUILD/tools/moe_ep_conformance bench --backend nvlink -t 128,4096 -G --no-baselines $flag \
    -J "$OUT/bench${flag:+_zero_copy}.json" > "$OUT/bench${flag:+_zero_copy}.log" 2>&1 || status=1
  tail -6 "$OUT/bench${flag:+_zero_copy}.log"
done
exit $status
