#!/usr/bin/env bash
# The fifth session's first device call (2 GPUs, nvidia-h200-x2):
#  1. (the NCCL registration probe, first run here, is now in pull_ab_check.sh);
#  2. the whole-row pull with the own rank's partials loaded by the consumers
#     (MOE_EP_PULL_OWN_DIRECT=1, new default) against through the row buffers
#     (=0), on 8, 16, 24 SMs and all, at 4096 tokens;
#  3. the suites that run both pull paths, racecheck and memcheck on the new
#     one, and the NCCL checks not yet run on the final NCCL code of the fourth
#     session (check --backend nccl, its GPU suites);
#  4. the default bench with the ceiling and NCCL.
#   usage: OUT=/dir bash scripts/gpu/session5_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-540}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo copy); nccl ${nccl_root:-system}" | tee -a "$SUMMARY"
build_step 200
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
TOOL=$BUILD/tools/moe_ep_conformance
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"
SHAPE="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"

# 1. The NCCL registration probe moved to scripts/gpu/pull_ab_check.sh.

# 2. Pull: own partials direct (default) against through the ring.
B="bench --backend nvlink $SHAPE -t 4096 -w 10 -n 40 --graph --zero-copy-combine --no-baselines"
for sms in 16 8 24 0; do
  for direct in 1 0; do
    NPICK=1 PICK="^ +4096 \|" step "pull_sms${sms}_direct${direct}" 25 $MPI2 -x MOE_EP_PULL_OWN_DIRECT=$direct \
      $TOOL $B --num-sms $sms
  done
done

# 3. Correctness of both pull paths and of the NCCL backend's final code.
nvlink_suites 120 nvlink_gpu_np2 nvlink_gpu_dispatch_bulk_general_np2
step racecheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[zero_copy]"
step memcheck_pull 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[zero_copy],[bad_ids]"
[ "${SKIP_NCCL_CHECKS:-0}" = 1 ] || {
  step check_nccl 90 $MPI2 $TOOL check --backend nccl
  nvlink_suites 120 nccl_gpu_np2 nccl_gpu_specific_np2
}

# 4. The default bench with the ceiling and NCCL.
NPICK=12 PICK="^ +[0-9]+ " step bench_nvlink 60 $MPI2 $TOOL bench --backend nvlink $SHAPE -t 1,128,512,4096 -w 10 -n 50 \
  --graph --zero-copy-combine --json "$OUT/bench_graph.json"
echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
