#!/usr/bin/env bash
# One short device call (2 GPUs): the whole-row pull of a given commit (OLD,
# default 175632c: before the own rank's partials left the row buffers) built
# beside this tree's, both benched at 4096 tokens on 16, 8 and 24 SMs in the
# same call, this tree's with MOE_EP_PULL_OWN_DIRECT=1 and =0; then the NCCL
# user-buffer registration probe (scripts/gpu/nccl_register_probe.cu).
#   usage: OUT=/dir [OLD=commit] [SUITES=1] [PROBE=0] bash scripts/gpu/pull_ab_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-300}
BUILD=${BUILD:-build-final}
OLD=${OLD:-175632c}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
build_step 120 moe_ep_conformance $([ "${SUITES:-0}" = 1 ] && echo test_nvlink_gpu)
# The old tree: this one with the old combine_pull.cu (the kernel header only
# gained a field since).
rm -rf /tmp/old && mkdir -p /tmp/old
tar --exclude=./build-final --exclude=./build --exclude=./.git -cf - . | tar -xf - -C /tmp/old
git show "$OLD:cuda/combine_pull.cu" > /tmp/old/cuda/combine_pull.cu || echo "no $OLD here" | tee -a "$SUMMARY"
(cd /tmp/old && BUILD=/tmp/old/build-old build_step 150 moe_ep_conformance)
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
B="bench --backend nvlink $SHAPE -t 4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines"
MPI2="mpirun -np 2 --bind-to none"
for sms in 16 8 24 0; do
  NPICK=1 PICK="^ +4096 \|" step "pull_sms${sms}_old" 25 $MPI2 /tmp/old/build-old/tools/moe_ep_conformance $B --num-sms $sms
  for direct in 1 0; do
    NPICK=1 PICK="^ +4096 \|" step "pull_sms${sms}_direct${direct}" 25 $MPI2 -x MOE_EP_PULL_OWN_DIRECT=$direct \
      $BUILD/tools/moe_ep_conformance $B --num-sms $sms
  done
done
for producers in 1 3 4; do
  NPICK=1 PICK="^ +4096 \|" step "pull_sms16_direct1_p$producers" 25 $MPI2 -x MOE_EP_PULL_PRODUCERS=$producers \
    $BUILD/tools/moe_ep_conformance $B --num-sms 16
done
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
if [ "${SUITES:-0}" = 1 ]; then
  nvlink_suites 120 nvlink_gpu_np2 nvlink_gpu_dispatch_bulk_np2 nvlink_gpu_dispatch_bulk_general_np2
  step racecheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 compute-sanitizer --print-limit 20 --error-exitcode 3 --tool racecheck \
    $GPU_TEST "[zero_copy]"
fi
[ "${PROBE:-1}" = 1 ] || nccl_pip=
[ "${PROBE:-1}" = 1 ] && nccl_pip=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null)
if [ -n "$nccl_pip" ] && [ -f "$nccl_pip/include/nccl.h" ]; then
  mpi_inc=$(mpicxx --showme:incdirs | awk '{print $1}')
  mpi_lib=$(mpicxx --showme:libdirs | awk '{print $1}')
  step probe_build 60 nvcc -O2 -arch=sm_90 -I"$nccl_pip/include" -I"$mpi_inc" scripts/gpu/nccl_register_probe.cu \
    -L"$nccl_pip/lib" -l:libnccl.so.2 -L"$mpi_lib" -lmpi -o /tmp/nccl_register_probe
  NPICK=8 PICK="nccl |eager" step nccl_register_probe 60 $MPI2 -x NCCL_DEBUG=INFO -x NCCL_DEBUG_SUBSYS=REG \
    -x LD_LIBRARY_PATH="$nccl_pip/lib:${LD_LIBRARY_PATH:-}" /tmp/nccl_register_probe
  grep -i "IPC\|regist" "$STEP_LOG_DIR/nccl_register_probe.log" | head -8 >> "$SUMMARY"
fi
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
