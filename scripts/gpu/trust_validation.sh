#!/usr/bin/env bash
# The trust checks that need GPUs, in one device call on a 2-GPU NVLink machine
# (device kind nvidia-h200-x2, .device-deps/ carried), within BUDGET seconds:
#   1. build the GPU test programs;
#   2. the fd exchange tests (CPU, here as root: the other-uid intruder runs);
#   3. the kill probe: a rank SIGKILLed mid-dispatch; the survivor gets TIMEOUT
#      within timeout_ms + 1 s naming the phase and the rank, destroys, and a
#      fresh group creates a handle;
#   4. a fresh mpirun group: runtime_max_tokens_per_rank differing between
#      ranks (INVALID_INPUT everywhere), destroy after graph replays against
#      unrelated device work;
#   5. compute-sanitizer memcheck, racecheck and synccheck around each of 2
#      ranks on a representative subset of the GPU suite;
#   6. the GPU CTest suites, as far as the budget goes;
#   7. a short bench (graph replay) to compare with docs/performance.md.
#   usage: OUT=/some/dir [DEPS=.device-deps/usr] [BUDGET=280] bash scripts/gpu/trust_validation.sh
set -uo pipefail
OUT=${OUT:-$PWD/trust-out}
DEPS=${DEPS:-$PWD/.device-deps/usr}
BUDGET=${BUDGET:-280}
BUILD=${BUILD:-build-trust}
mkdir -p "$OUT"
LOG=$OUT/trust.log
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
START=$(date +%s)
remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }
say() { echo "### $*" | tee -a "$LOG"; }
rc=0
step() {  # step NAME LIMIT COMMAND...: capped by what is left of BUDGET; a failure marks rc, the next step runs
  local name=$1 limit=$2
  shift 2
  local left
  left=$(remaining)
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    echo "$name: NOT RUN (budget spent)" | tee -a "$SUMMARY"
    rc=1
    return
  fi
  say "$name (limit ${limit} s)"
  local t0
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local s=$?
  tail -n "${TAIL:-15}" "$OUT/$name.log" | tee -a "$LOG"
  echo "$name: exit $s in $(( $(date +%s) - t0 )) s" | tee -a "$SUMMARY" "$LOG"
  [ "$s" -eq 0 ] || rc=1
}
MPIRUN="mpirun -np 2 --bind-to none"
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
SAN="$SANITIZER --print-limit 20 --error-exitcode 3"
GPU_TEST=$BUILD/test/nvlink/test_nvlink_gpu

say "commit $(git rev-parse --short HEAD 2>/dev/null || echo '(copy)'); deps $DEPS"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee -a "$LOG"
# Only the programs these steps run (the bindings are validated elsewhere).
TAIL=5 step build 150 bash -c "cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH='$DEPS' && ninja -C $BUILD -j32 test_nvlink_gpu moe_ep_kill_peer_probe test_nvlink_host moe_ep_conformance"
[ -x "$GPU_TEST" ] || { cat "$SUMMARY"; exit 1; }

TAIL=4 step fd_exchange 30 $BUILD/test/nvlink/test_nvlink_host "[fd_exchange]"
TAIL=8 step kill_peer 40 $BUILD/test/nvlink/moe_ep_kill_peer_probe
TAIL=8 step fresh_mpirun_peer_counts 40 $MPIRUN $GPU_TEST "[peer_counts]" -s -r compact
# MOE_EP_LOG=info prints how long each teardown step of destroy took (a step the
# driver makes wait for the whole device stands out).
TAIL=10 step destroy_scope 30 $MPIRUN -x MOE_EP_LOG=info $GPU_TEST "[destroy_scope]" -r compact

# Sanitizers: a representative subset (mismatched peer counts, bad ids: both
# kernels of each phase, the error paths), small shapes so that each tool
# finishes in well under a minute.
# MOE_EP_FABRIC=0: skip the FABRIC attempt that this machine's driver refuses
# (no IMEX channel), which memcheck would count as an API error.
TAIL=6 step memcheck 60 $MPIRUN -x MOE_EP_FABRIC=0 $SAN --tool memcheck $GPU_TEST "[peer_counts],[bad_ids]"
TAIL=6 step racecheck 60 $MPIRUN $SAN --tool racecheck $GPU_TEST "[peer_counts]"
TAIL=6 step synccheck 60 $MPIRUN $SAN --tool synccheck $GPU_TEST "[peer_counts]"

TAIL=25 step ctest_gpu 150 ctest --test-dir $BUILD --output-on-failure -L gpu -E python -j1 --timeout 120

# Speed after the checks: compare with docs/performance.md (graph replay, slower rank).
TAIL=12 step bench 40 $MPIRUN $BUILD/tools/moe_ep_conformance bench --backend nvlink --hidden 7168 --topk 8 \
  --experts 256 --dtype bf16 --routing uniform -t 1,128,4096 -w 10 -n 50 --graph

say "sanitizer summaries"
for tool in memcheck racecheck synccheck; do
  grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/$tool.log" 2>/dev/null | sed "s/^/$tool: /" | tee -a "$SUMMARY"
done
say "kill probe and timings"
grep -h "survivor\|fresh group\|kill round\|destroy took\|: destroy " "$OUT"/kill_peer.log "$OUT"/destroy_scope.log \
  2>/dev/null | tee -a "$SUMMARY"
say "summary (exit $rc, $(( $(date +%s) - START )) s)"
cat "$SUMMARY"
exit $rc
