# Sourced by the device scripts (scripts/gpu/*.sh): the environment every GPU
# run needs, NCCL from pip where the system has none, and `step`.
#
#   step NAME LIMIT CMD...   runs CMD with a timeout of LIMIT seconds, or of
#       what is left of BUDGET seconds since START (skipped under 15 s); its
#       output is appended behind a header to $OUT/logs.txt; one line per step
#       goes to $SUMMARY: exit status, seconds, and the last $NPICK (default 2)
#       lines of the output that match $PICK (default: test and sanitizer
#       verdicts).  A failing step sets rc=1 and prints the end of its output.
#       STEP_LOG_DIR (default: a temporary folder) keeps NAME.log per step.
#   build_step LIMIT [TARGET...]   the step "build": configures $BUILD (Release,
#       compute capability 9.0, dependencies from $DEPS, default
#       ./.device-deps/usr) and builds the targets (all without any) with ninja.
#   nvlink_suites LIMIT SUITE...   one step per NVLink GPU CTest suite of
#       $BUILD (ctest_SUITE), LIMIT seconds each.
#   proxy_build BUILD_DIR OUTPUT   builds scripts/gpu/pull_proxy_bench.cpp (the
#       one-GPU stand-in benchmark) against BUILD_DIR's libmoe_ep.
#   diag_proxy NAME SOURCE_DIR   the step "build_NAME": a -DMOE_EP_DIAGNOSTICS
#       Release build of SOURCE_DIR's libmoe_ep in build-NAME, then the proxy
#       against it as /tmp/proxy_NAME.
#   one_gpu_suites LIMIT   one step per GPU CTest suite of $BUILD that runs on
#       one GPU (every one but NCCL's, which need a GPU per rank), LIMIT seconds
#       each, and a summary line naming the NCCL suites left out.
#   ab_builds   diag_proxy "base" from .ab_base/ and "new" from this tree.
#   ab_proxy LABEL[:BINARY] NAME TOKENS SMS WARMUP ITERS [VAR=VALUE...]   the
#       step "LABEL_NAME": /tmp/proxy_BINARY (diag_proxy; default LABEL) with
#       those variables set, its median line picked.  The proxy's two ranks
#       share one GPU: at most half its SMs each (132 never finishes).
#   trace_summaries   dispatch_trace.py over every "*trace_*" step log, into
#       $OUT/trace_summary.txt.
#   nvlink_bench LABEL RANKS TOOL TOKENS WARMUP ITERS [VAR=VALUE...]   the step
#       LABEL: TOOL's bench --backend nvlink --graph --no-baselines on RANKS
#       ranks (oversubscribed where they share GPUs) with those variables set,
#       plus $BENCH_ARGS; the last $NPICK (default 8) size lines picked.
#   tool_build NAME SOURCE_DIR [CMAKE_ARG...]   the step "build_tool_NAME": a
#       Release build of SOURCE_DIR's conformance tool in build-tool-NAME.
#   one_gpu_validation   the one-GPU validation of $BUILD: one_gpu_suites, the
#       NVLink conformance check (2 and 4 ranks, zero-copy, 8 SMs, the
#       look-back forced), the fd exchange, and compute-sanitizer memcheck /
#       racecheck / synccheck on the NVLink kernels (the small-batch kernels at
#       512 tokens among them), memcheck / racecheck with the look-back forced.
# Callers set OUT, SUMMARY and BUDGET before sourcing; START and rc are set here.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
SUMMARY=${SUMMARY:-$OUT/summary.txt}
BUDGET=${BUDGET:-560}
START=$(date +%s)
STEP_LOG_DIR=${STEP_LOG_DIR:-$(mktemp -d)}
rc=0
: > "$SUMMARY"

if ! ldconfig -p 2> /dev/null | grep -q libnccl.so.2; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null)
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    echo "$name: SKIPPED (budget)" | tee -a "$SUMMARY"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 log s
  t0=$(date +%s)
  log="$STEP_LOG_DIR/$name.log"
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  s=$?
  { echo "===== $name (exit $s)"; cat "$log"; } >> "$OUT/logs.txt"
  local picked
  picked=$(grep -hE "${PICK:-All tests passed|test cases|passed, |ERROR SUMMARY|RACECHECK SUMMARY|tests passed|skipped:}" "$log" |
    tail -"${NPICK:-2}" | tr '\n' ' ')
  echo "$name: exit $s in $(($(date +%s) - t0)) s | $picked" | tee -a "$SUMMARY"
  [ "$s" -eq 0 ] || { rc=1; tail -25 "$log"; }
}

build_step() {
  local limit=$1
  shift
  local deps=${DEPS:-$PWD/.device-deps/usr}
  PICK="${PICK:-Linking|error}" step build "$limit" bash -c "cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='$deps' && ninja -C '$BUILD' -j32 $*"
}

nvlink_suites() {
  local limit=$1 t
  shift
  for t in "$@"; do
    step "ctest_$t" "$limit" ctest --test-dir "$BUILD" -R "^$t\$" --output-on-failure --timeout $((limit - 5))
  done
}

proxy_build() {
  g++ -O2 -std=c++17 scripts/gpu/pull_proxy_bench.cpp test/support/thread_bootstrap.cpp -Iinclude -Itest/support \
    -I/usr/local/cuda/include -L"$1/src" -Wl,-rpath,"$1/src" -lmoe_ep -L/usr/local/cuda/lib64 -lcudart -lpthread -o "$2"
}

diag_proxy() {
  PICK="Linking|error" step "build_$1" 120 bash -c "cmake -S '$2' -B '$PWD/build-$1' -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='${DEPS:-$PWD/.device-deps/usr}' \
    -DCMAKE_CUDA_FLAGS=-DMOE_EP_DIAGNOSTICS -DCMAKE_CXX_FLAGS=-DMOE_EP_DIAGNOSTICS && ninja -C '$PWD/build-$1' -j32 moe_ep"
  proxy_build "$PWD/build-$1" "/tmp/proxy_$1" >> "$OUT/proxy_build.log" 2>&1 ||
    { echo "proxy_$1: FAILED" | tee -a "$SUMMARY"; rc=1; }
}

ab_proxy() {
  local label=${1%%:*} binary=${1##*:} name=$2 t=$3 sms=$4 w=$5 n=$6
  shift 6
  NPICK=1 PICK="^proxy" step "${label}_$name" 40 env "$@" "/tmp/proxy_$binary" "$t" "$sms" "$w" "$n"
}

trace_summaries() {
  local f
  for f in "$STEP_LOG_DIR"/*trace_*.log; do
    { echo "== $(basename "$f" .log)"; python3 "$(dirname "${BASH_SOURCE[0]}")/dispatch_trace.py" "$f"; } >> "$OUT/trace_summary.txt"
  done
}

one_gpu_suites() {
  local limit=$1 t all
  all=$(cd "$BUILD" && ctest -N -L gpu | sed -n 's/^ *Test *#[0-9]*: //p')
  for t in $(grep -v nccl <<< "$all"); do
    step "ctest_$t" "$limit" ctest --test-dir "$BUILD" -R "^$t\$" --output-on-failure --timeout $((limit - 10))
  done
  echo "not run here (NCCL needs one GPU per rank): $(grep nccl <<< "$all" | tr '\n' ' ')" | tee -a "$SUMMARY"
}

ab_builds() {
  diag_proxy base "$PWD/.ab_base"
  diag_proxy new "$PWD"
}

nvlink_bench() {
  local label=$1 ranks=$2 tool=$3 tokens=$4 w=$5 n=$6
  shift 6
  local xs=() kv
  for kv in "$@"; do xs+=(-x "$kv"); done
  NPICK=${NPICK:-8} PICK="^ +[0-9]+ \|" step "$label" 90 env "$@" mpirun -np "$ranks" --oversubscribe --bind-to none \
    "${xs[@]}" "$tool" bench --backend nvlink -t "$tokens" --graph --no-baselines -w "$w" -n "$n" ${BENCH_ARGS:-}
}

tool_build() {
  local name=$1 src=$2
  shift 2
  PICK="Linking|error" step "build_tool_$name" 200 bash -c "cmake -S '$src' -B '$PWD/build-tool-$name' -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH='${DEPS:-$PWD/.device-deps/usr}' $* && \
    ninja -C '$PWD/build-tool-$name' -j32 moe_ep_conformance"
}

one_gpu_validation() {
  local tool="$BUILD/tools/moe_ep_conformance" gpu_test="$BUILD/test/nvlink/test_nvlink_gpu"
  local mpi2="mpirun -np 2 --bind-to none" san="compute-sanitizer --print-limit 20 --error-exitcode 3"
  local look="-x MOE_EP_DISPATCH_LOOKBACK=1 -x MOE_EP_SMALL_BATCH=0"
  local cases="[peer_counts],[bad_ids],[zero_copy],[routing],[small_batch],token counts*"
  one_gpu_suites 150
  step check_nvlink 90 $mpi2 $tool check --backend nvlink
  step check_nvlink_zero_copy 90 $mpi2 $tool check --backend nvlink --zero-copy-combine
  step check_nvlink_4ranks 120 mpirun -np 4 --oversubscribe --bind-to none $tool check --backend nvlink \
    --zero-copy-combine
  step check_nvlink_sms8 90 $mpi2 $tool check --backend nvlink --num-sms 8 --zero-copy-combine
  step check_nvlink_look 90 $mpi2 $look $tool check --backend nvlink
  step fd_exchange_root 30 "$BUILD/test/nvlink/test_nvlink_host" "[fd_exchange]"
  step memcheck_nvlink 150 $mpi2 -x MOE_EP_FABRIC=0 $san --tool memcheck $gpu_test "$cases"
  step racecheck_nvlink 150 $mpi2 -x MOE_EP_FABRIC=0 $san --tool racecheck $gpu_test "$cases"
  step synccheck_nvlink 120 $mpi2 -x MOE_EP_FABRIC=0 $san --tool synccheck $gpu_test "$cases"
  step memcheck_look 120 $mpi2 -x MOE_EP_FABRIC=0 $look $san --tool memcheck $gpu_test "[peer_counts],[bad_ids],[routing]"
  step racecheck_look 150 $mpi2 -x MOE_EP_FABRIC=0 $look $san --tool racecheck $gpu_test "[peer_counts],[routing]"
}
