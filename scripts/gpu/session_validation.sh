#!/usr/bin/env bash
# One device call (2 GPUs, nvidia-h200-x2) that validates main after a merge of
# several branches: build everything once; every GPU CTest suite (NVLink, NCCL
# over NVLink and over its socket transport, the kill probe, the torch
# bindings); the conformance check on the NVLink and NCCL backends (both NCCL
# transports); the trust checks (fd exchange as root, destroy timing, mismatched
# runtime max); compute-sanitizer memcheck, racecheck and synccheck on the
# NVLink kernels and memcheck on the NCCL kernels; a short NVLink bench.
#   usage: OUT=/dir [DEPS=prefix] bash scripts/gpu/session_validation.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
DEPS=${DEPS:-$PWD/.device-deps/usr}
BUDGET=${1:-560}
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/summary.txt
source "$(dirname "$0")/steps.sh"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo copy); nccl ${nccl_root:-system}" | tee -a "$SUMMARY"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"

build_step 240
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
TOOL="$BUILD/tools/moe_ep_conformance"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu
MPI2="mpirun -np 2 --bind-to none"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
SAN="compute-sanitizer --print-limit 20 --error-exitcode 3"

# Every GPU suite, one at a time (they measure device memory).
for t in $(cd $BUILD && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p'); do
  step "ctest_$t" 150 ctest --test-dir $BUILD -R "^$t\$" --output-on-failure --timeout 140
done
step check_nvlink 90 $MPI2 $TOOL check --backend nvlink
step check_nccl 90 $MPI2 $TOOL check --backend nccl
step check_nccl_network 90 $MPI2 $NET_ENV sh -c "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $TOOL check --backend nccl"
step check_nccl_4ranks 60 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nccl --filter basic
step fd_exchange_root 30 $BUILD/test/nvlink/test_nvlink_host "[fd_exchange]"
NPICK=6 PICK=": destroy |destroy took|passed|failed" step destroy_scope 40 $MPI2 -x MOE_EP_LOG=info $GPU_TEST "[destroy_scope]"
step memcheck_nvlink 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[peer_counts],[bad_ids],[zero_copy]"
step racecheck_nvlink 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool racecheck $GPU_TEST "[peer_counts],[zero_copy]"
step synccheck_nvlink 90 $MPI2 -x MOE_EP_FABRIC=0 $SAN --tool synccheck $GPU_TEST "[peer_counts],[zero_copy]"
step memcheck_nccl 90 $MPI2 $SAN --tool memcheck --report-api-errors no $TOOL check --backend nccl --filter basic --modes eager --rounds 1
NPICK=12 PICK="^ +[0-9]+ " step bench_nvlink 60 $MPI2 $TOOL bench --backend nvlink --hidden 7168 --topk 8 --experts 256 \
  --dtype bf16 --routing uniform -t 1,128,512,4096 -w 10 -n 50 --graph --zero-copy-combine --json "$OUT/bench_graph.json"
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
