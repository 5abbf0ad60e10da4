#!/usr/bin/env bash
# One device call (2 GPUs) for the NCCL dispatch pack at two blocks per SM:
# build the NCCL suite and the tool; the NCCL GPU suite over NVLink and
# pipelined (3 row ranges: the pack's slot ranges); then bench --backend nccl
# at 4096 tokens next to NCCL's own send/recv, plain and with the stage
# profile (MOE_EP_NCCL_PROFILE=1, logged at destroy).
#   usage: OUT=/dir bash scripts/gpu/nccl_pack_check.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
BUDGET=${1:-200}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
if [ -z "${MOE_EP_NCCL_LIBRARY:-}" ] && [ -n "${nccl_root:-}" ]; then export MOE_EP_NCCL_LIBRARY="$nccl_root/lib/libnccl.so.2"; fi
build_step 150 test_nvlink_gpu moe_ep_conformance
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
[ -n "${MOE_EP_NCCL_LIBRARY:-}" ] && MPI2="$MPI2 -x MOE_EP_NCCL_LIBRARY -x LD_LIBRARY_PATH"
BENCH="bench --backend nccl --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 5 -n 30"
NPICK=4 PICK="^ +4096 \|" step bench_nccl 40 $MPI2 $TOOL $BENCH
step suite_nccl 60 ctest --test-dir $BUILD -R '^nccl_gpu_np2$' --output-on-failure --timeout 55
step suite_nccl_pipelined 60 ctest --test-dir $BUILD -R '^nccl_gpu_pipelined_np2$' --output-on-failure --timeout 55
NPICK=8 PICK="^ +4096 \||rank 0: (dispatch|combine)" step bench_nccl_profile 40 $MPI2 -x MOE_EP_NCCL_PROFILE=1 -x MOE_EP_LOG=info $TOOL $BENCH
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
