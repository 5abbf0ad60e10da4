#!/usr/bin/env bash
# GPU validation of the NCCL backend in one device call (2 GPUs): build; the GPU
# suite on NCCL over NVLink and over NCCL's network transport (sockets on
# loopback, a distinct NCCL_HOSTID per rank, as two nodes would use it); the
# NCCL-only GPU cases (timeouts, lifecycle); `moe_ep_conformance check
# --backend nccl` on both transports and with 4 ranks on 2 GPUs (NCCL refuses:
# the tool must say so and skip); `bench --backend nccl` next to NCCL's own
# grouped send/recv on both transports; a 4-rank bench whose NCCL baseline must
# be skipped; compute-sanitizer memcheck on a short NCCL case; a summary.
# Run from the repository root; logs go to $OUT (default ./gpu-out); DEPS = the
# prefix with CLI11, Catch2 and dlpack (default ./.device-deps/usr).
#   usage: scripts/gpu/nccl_validation.sh [stage ...]   stages: build suite check bench memcheck (default: all)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
stages=${*:-build suite check bench memcheck}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-build-nccl}
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
# Few files come back from a device call, and a call cut short must keep what
# ran: every log is appended to logs.txt as soon as its step ends.
keep() { for f in "$@"; do [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; } >> "$OUT/logs.txt" && rm -f "$f"; done; }

# NCCL from pip (nvidia-nccl-cu13) when the loader cannot find libnccl.so.2 by itself.
if ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
note "libnccl: ${nccl_root:-system} ; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

NET_ENV=(-x NCCL_P2P_DISABLE=1 -x NCCL_SHM_DISABLE=1 -x NCCL_SOCKET_IFNAME=lo)
per_rank_host() { echo "NCCL_HOSTID=moe_ep_host\$OMPI_COMM_WORLD_RANK exec $*"; }
TOOL=$BUILD/tools/moe_ep_conformance

has() { case " $stages " in *" $1 "*) return 0;; *) return 1;; esac; }

if has build; then
  start=$(date +%s)
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="${DEPS:-$PWD/.device-deps/usr}" > "$OUT/build.log" 2>&1 &&
    ninja -C $BUILD -j32 test_nvlink_gpu test_nccl_gpu moe_ep_conformance >> "$OUT/build.log" 2>&1
  rc=$?
  note "build rc=$rc in $(( $(date +%s) - start )) s"
  keep "$OUT/build.log"
  if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|FAILED" "$OUT/logs.txt" | head -60; exit $rc; fi
fi

if has suite; then
  for t in nccl_gpu_np2 nccl_gpu_specific_np2 nccl_gpu_network_np2 nccl_gpu_pipelined_np2; do
    start=$(date +%s)
    (cd $BUILD && timeout 100 ctest -R "^$t\$" -V --timeout 95) > "$OUT/ctest_$t.log" 2>&1
    rc=$?
    note "ctest $t rc=$rc in $(( $(date +%s) - start )) s: $(grep -E 'All tests passed|test cases.*failed|tests passed' "$OUT/ctest_$t.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && grep -B3 -A25 -E "FAILED|with expansion|exception" "$OUT/ctest_$t.log" | head -80
    keep "$OUT/ctest_$t.log"
  done
  # The chunked combine (two streams, fork/join) inside a CUDA graph, and eager.
  timeout 60 mpirun -np 2 --bind-to none -x MOE_EP_TEST_GPU_BACKEND=nccl -x MOE_EP_NCCL_COMBINE_CHUNKS=4 \
    $BUILD/test/nvlink/test_nvlink_gpu "[graph],[bad_ids]" \
    > "$OUT/suite_chunks4.txt" 2>&1
  note "suite [graph],[bad_ids] with combine chunks=4 rc=$?: $(grep -E 'All tests passed|test cases' "$OUT/suite_chunks4.txt" | head -1)"
  keep "$OUT/suite_chunks4.txt"
fi

if has check; then
  timeout 100 mpirun -np 2 --bind-to none $TOOL check --backend nccl > "$OUT/check_nccl_nvlink.txt" 2>&1
  note "check nccl (default transports) rc=$?: $(tail -1 "$OUT/check_nccl_nvlink.txt")"; keep "$OUT/check_nccl_nvlink.txt"
  timeout 60 mpirun -np 2 --bind-to none "${NET_ENV[@]}" sh -c "$(per_rank_host $TOOL check --backend nccl)" \
    > "$OUT/check_nccl_network.txt" 2>&1
  note "check nccl (network transport) rc=$?: $(tail -1 "$OUT/check_nccl_network.txt")"; keep "$OUT/check_nccl_network.txt"
  timeout 60 mpirun -np 4 --oversubscribe --bind-to none $TOOL check --backend nccl --filter basic \
    > "$OUT/check_nccl_4ranks.txt" 2>&1
  note "check nccl 4 ranks on 2 GPUs rc=$?: $(tail -1 "$OUT/check_nccl_4ranks.txt")"; keep "$OUT/check_nccl_4ranks.txt"
fi

if has bench; then
  common=(--hidden 7168 --experts 256 --topk 8 -t 128,4096 -w 5 -n 30)
  timeout 90 mpirun -np 2 --bind-to none $TOOL bench --backend nccl "${common[@]}" \
    > "$OUT/bench_nccl_nvlink.txt" 2>&1
  note "bench nccl (default transports) rc=$?"
  timeout 70 mpirun -np 2 --bind-to none "${NET_ENV[@]}" sh -c \
    "$(per_rank_host $TOOL bench --backend nccl --hidden 7168 --experts 256 --topk 8 -t 128,4096 -w 2 -n 10)" \
    > "$OUT/bench_nccl_network.txt" 2>&1
  note "bench nccl (network transport) rc=$?"
  for f in bench_nccl_nvlink bench_nccl_network; do
    echo "--- $f" >> "$SUMMARY"
    grep -vE '^#  Rank' "$OUT/$f.txt" | head -40 >> "$SUMMARY"
    keep "$OUT/$f.txt"
  done
  MOE_EP_LOG=info MOE_EP_NCCL_PROFILE=1 timeout 60 mpirun -np 2 --bind-to none -x MOE_EP_LOG -x MOE_EP_NCCL_PROFILE \
    $TOOL bench --backend nccl --hidden 7168 --experts 256 --topk 8 -t 4096 -w 5 -n 30 > "$OUT/bench_nccl_profile.txt" 2>&1
  note "bench nccl stage profile rc=$?: $(grep -E 'stages, mean' "$OUT/bench_nccl_profile.txt" | sed 's/^\[moe_ep\] //' | tr '\n' ' ')"
  keep "$OUT/bench_nccl_profile.txt"
  for chunks in 2; do
    timeout 60 mpirun -np 2 --bind-to none -x MOE_EP_NCCL_COMBINE_CHUNKS=$chunks $TOOL bench --backend nccl \
      --hidden 7168 --experts 256 --topk 8 -t 4096 -w 5 -n 30 > "$OUT/bench_nccl_chunks$chunks.txt" 2>&1
    note "bench nccl combine chunks=$chunks rc=$?: $(grep -E '^ +4096 ' "$OUT/bench_nccl_chunks$chunks.txt" | tr -s ' ' | tr '\n' ' ')"
    keep "$OUT/bench_nccl_chunks$chunks.txt"
  done
  timeout 60 mpirun -np 4 --oversubscribe --bind-to none $TOOL bench --backend nvlink -t 128 -w 2 -n 5 \
    > "$OUT/bench_nvlink_4ranks.txt" 2>&1
  note "bench nvlink 4 ranks on 2 GPUs rc=$?: $(grep -E 'NCCL baseline skipped' "$OUT/bench_nvlink_4ranks.txt")"
  keep "$OUT/bench_nvlink_4ranks.txt"
fi

if has memcheck; then
  # Memory errors only: NCCL probes features (FABRIC handles, ...) through API calls that fail by design.
  timeout 75 mpirun -np 2 --bind-to none compute-sanitizer --tool memcheck --report-api-errors no --print-limit 20 \
    $TOOL check --backend nccl --filter basic --modes eager --rounds 1 > "$OUT/memcheck_nccl.txt" 2>&1
  note "memcheck nccl rc=$?: $(grep -E 'ERROR SUMMARY' "$OUT/memcheck_nccl.txt" | tr '\n' ' ')"
  keep "$OUT/memcheck_nccl.txt"
fi
cat "$SUMMARY"
