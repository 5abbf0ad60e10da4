#!/usr/bin/env bash
# The NCCL backend's speed work (fused routing, own rows packed during the
# transfer, one metadata send per peer, the reduction with more bytes in
# flight; docs/nccl_backend.md) checked in one device call on 2 GPUs, most
# important first, each step within what is left of the budget:
#   build (the GPU suite, the NCCL-only cases and the conformance tool);
#   `bench --backend nccl` at 4096 tokens over NVLink next to NCCL's own
#   grouped send/recv (eager, no profiling events: the figures to compare);
#   the GPU suite on the NCCL backend over NVLink and over NCCL's network
#   transport (sockets on loopback, a distinct NCCL_HOSTID per rank);
#   `check --backend nccl` on both transports; the same bench with
#   MOE_EP_NCCL_PROFILE=1 (stage times, logged at destroy); the bench over the
#   network transport; the pipelined suite (3 row ranges) and the NCCL-only
#   cases; then a summary with the ratios.
# Run from the repository root; logs go to $OUT (default ./gpu-out); DEPS = the
# prefix with CLI11, Catch2 and dlpack (default ./.device-deps/usr).
#   usage: OUT=/dir [DEPS=prefix] [BUILD=dir] bash scripts/gpu/nccl_fast_validation.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
DEPS=${DEPS:-$PWD/.device-deps/usr}
BUDGET=${1:-400}
BUILD=${BUILD:-build-nccl-fast}
SUMMARY=$OUT/summary.txt
STEP_LOG_DIR=$OUT  # the ratios below read the bench logs
source "$(dirname "$0")/steps.sh"
# NCCL from pip (steps.sh put it on the loader path for the tests) is also
# named for the library.
if [ -z "${MOE_EP_NCCL_LIBRARY:-}" ] && [ -n "${nccl_root:-}" ] && [ -f "$nccl_root/lib/libnccl.so.2" ]; then
  export MOE_EP_NCCL_LIBRARY="$nccl_root/lib/libnccl.so.2"
fi
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo copy); libnccl ${MOE_EP_NCCL_LIBRARY:-from the loader path}" | tee -a "$SUMMARY"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$SUMMARY"

build_step 200 test_nvlink_gpu test_nccl_gpu moe_ep_conformance
[ -x $BUILD/tools/moe_ep_conformance ] || { cat "$SUMMARY"; exit 1; }
TOOL="$BUILD/tools/moe_ep_conformance"
MPI2="mpirun -np 2 --bind-to none -x NCCL_NVLS_ENABLE"
[ -n "${MOE_EP_NCCL_LIBRARY:-}" ] && MPI2="$MPI2 -x MOE_EP_NCCL_LIBRARY -x LD_LIBRARY_PATH"
NET_ENV="-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo"
NET_HOST='NCCL_HOSTID=moe_ep_host$OMPI_COMM_WORLD_RANK exec'
BENCH="bench --backend nccl --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096"

NPICK=4 PICK="^ +4096 " step bench_nvlink 60 $MPI2 $TOOL $BENCH -w 5 -n 30
step suite_nvlink 100 ctest --test-dir $BUILD -R '^nccl_gpu_np2$' --output-on-failure --timeout 95
step suite_network 100 ctest --test-dir $BUILD -R '^nccl_gpu_network_np2$' --output-on-failure --timeout 95
step check_nvlink 60 $MPI2 $TOOL check --backend nccl
step check_network 70 $MPI2 $NET_ENV sh -c "$NET_HOST $TOOL check --backend nccl"
NPICK=8 PICK="^ +4096 |rank 0: (dispatch|combine)" step bench_nvlink_profile 40 \
  $MPI2 -x MOE_EP_NCCL_PROFILE=1 -x MOE_EP_LOG=info $TOOL $BENCH -w 5 -n 30
NPICK=4 PICK="^ +4096 " step bench_network 60 $MPI2 $NET_ENV sh -c "$NET_HOST $TOOL $BENCH -w 3 -n 10"
step suite_pipelined 100 ctest --test-dir $BUILD -R '^nccl_gpu_pipelined_np2$' --output-on-failure --timeout 95
step nccl_specific 60 ctest --test-dir $BUILD -R '^nccl_gpu_specific_np2$' --output-on-failure --timeout 55

# moe_ep / NCCL's own at 4096 tokens: row 1 of the bench table is moe_ep
# (dispatch | combine: us first), row 2 the baselines (NCCL dispatch, combine).
ratios() {
  local f=$OUT/$1.log
  [ -f "$f" ] || return
  local d c nd nc
  read -r d c < <(grep -E '^ +4096 \|' "$f" | sed -n 1p | awk -F'|' '{split($2, a, " "); split($3, b, " "); print a[2], b[2]}')
  read -r nd nc < <(grep -E '^ +4096 \|' "$f" | sed -n 2p | awk -F'|' '{split($3, a, " "); print a[1], a[4]}')
  awk -v n="$1" -v d="$d" -v c="$c" -v nd="$nd" -v nc="$nc" 'BEGIN {
    if (d + 0 > 0 && nd + 0 > 0 && c + 0 > 0 && nc + 0 > 0)
      printf "%s: dispatch %s us / NCCL %s us = %.2fx; combine %s us / NCCL %s us = %.2fx\n", n, d, nd, d / nd, c, nc, c / nc }'
}
{ ratios bench_nvlink; ratios bench_nvlink_profile; ratios bench_network; } | tee -a "$SUMMARY"
echo "total $(( $(date +%s) - START )) s, exit $rc" | tee -a "$SUMMARY"
exit $rc
