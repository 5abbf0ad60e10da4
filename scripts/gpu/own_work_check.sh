#!/usr/bin/env bash
# Short device call after a change to how the GPU backends wait for their own
# work (src/gpu/own_work.*): graph replays, timeouts, destroy scope and the
# kill probe on NVLINK_TWO_SIDED, and the graph, bad-id, timeout and lifecycle
# cases on NCCL.   usage: OUT=/dir bash scripts/gpu/own_work_check.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  r=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  [ -n "$r" ] && export LD_LIBRARY_PATH="$r/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
B=build-final
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$OUT/build.log" 2>&1 &&
  ninja -C $B -j32 test_nvlink_gpu test_nccl_gpu moe_ep_kill_peer_probe >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
rc=0
run() {  # run NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1; local s=$?
  echo "$name: exit $s | $(grep -hE 'All tests passed|test cases|destroy took|survivor|fresh group' "$OUT/$name.log" | tail -3 | tr '\n' ' ')"
  [ $s -eq 0 ] || { rc=1; tail -20 "$OUT/$name.log"; }
}
M="mpirun -np 2 --bind-to none"
run nvlink_graph_timeout 60 $M $B/test/nvlink/test_nvlink_gpu "[graph],[timeout],[peer_counts]"
run nvlink_destroy_scope 30 $M -x MOE_EP_LOG=info $B/test/nvlink/test_nvlink_gpu "[destroy_scope]"
run nvlink_kill_peer 40 $B/test/nvlink/moe_ep_kill_peer_probe
run nccl_graph_bad_ids 60 $M -x MOE_EP_TEST_GPU_BACKEND=nccl $B/test/nvlink/test_nvlink_gpu "[graph],[bad_ids]"
run nccl_timeout_lifecycle 60 $M $B/test/nvlink/test_nccl_gpu
exit $rc
