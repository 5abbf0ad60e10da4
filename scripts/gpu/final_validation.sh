#!/usr/bin/env bash
# One device call that validates a commit end to end on a 2-GPU NVLink machine
# (device kind nvidia-h200-x2, .device-deps/ carried):
#   1. build everything once (library, tests, tool with NCCL when present);
#   2. the whole CTest suite (GPU suites included) on the GPU machine;
#   3. moe_ep_conformance check on the NVLink backend;
#   4. bench, DeepSeek shape, graph and eager, plus 16 SMs at 4096 tokens; the plot;
#   5. the Python torch tests on CUDA tensors.
#   usage: OUT=/some/dir [NP=2] bash scripts/gpu/final_validation.sh   (NP: ranks for check and bench)
set -uo pipefail
# $OUT gets few files (the device tool brings back at most 8): final.log, the bench
# JSONs, the plot and logs.tar.gz with every step's full log.
OUT=${OUT:-$PWD/final-out}
LOGS=$(mktemp -d)/final-logs
mkdir -p "$OUT" "$LOGS"
LOG=$OUT/final.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
BUILD=build-final
say() { echo "### $*" | tee -a "$LOG"; }
rc=0
step() {  # step NAME SECONDS COMMAND...: logged; a failure marks rc and the next step still runs
  local name=$1 limit=$2
  shift 2
  say "$name"
  timeout "$limit" "$@" 2>&1 | tee -a "$LOGS/$name.log" | tail -${TAIL:-30}
  local s=${PIPESTATUS[0]}
  say "$name: exit $s"
  [ "$s" -eq 0 ] || rc=1
}

NCCL_ROOT=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
say "commit $(git rev-parse --short HEAD 2>/dev/null); nccl '${NCCL_ROOT}'"
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv | tee -a "$LOG"

say "build"
start=$(date +%s)
cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" ${NCCL_ROOT:+-DMOE_EP_NCCL_ROOT="$NCCL_ROOT"} \
  > "$LOGS/build.log" 2>&1 && ninja -C $BUILD -j32 >> "$LOGS/build.log" 2>&1
s=$?
say "build: exit $s in $(( $(date +%s) - start )) s"
[ $s -eq 0 ] || { tail -40 "$LOGS/build.log"; exit 1; }

# GPU suites one at a time: they measure device memory and must not share the GPUs.
TAIL=12 step ctest_cpu 180 ctest --test-dir $BUILD --output-on-failure -LE gpu -j8 --timeout 150
TAIL=12 step ctest_gpu 240 ctest --test-dir $BUILD --output-on-failure -L gpu -j1 --timeout 200
TOOL="mpirun -np ${NP:-2} --bind-to none $BUILD/tools/moe_ep_conformance"  # NP=4 or 8 on larger machines
DEEPSEEK="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
TAIL=4 step check 90 $TOOL check --backend nvlink
TAIL=12 step bench_graph 75 $TOOL bench --backend nvlink $DEEPSEEK -t 1,128,512,4096 -w 10 -n 50 --graph \
  --json "$OUT/bench_graph.json"
[ -n "${EAGER:-}" ] && TAIL=12 step bench_eager 75 $TOOL bench --backend nvlink $DEEPSEEK -t 1,128,512,4096 -w 10 \
  -n 50 --json "$OUT/bench_eager.json"
TAIL=8 step bench_sms16 45 $TOOL bench --backend nvlink $DEEPSEEK -t 4096 --num-sms 16 -w 10 -n 50 --graph \
  --json "$OUT/bench_sms16.json"
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 tools/plot_bench.py "$OUT"/bench_*.json \
    -o "$OUT/bench_h200x2.png" >> "$LOG" 2>&1 || say "plot failed"
fi
TAIL=6 step python_torch 120 env OUT="$LOGS/python" bash test/bindings/run_gpu_check.sh
tar czf "$OUT/logs.tar.gz" -C "$(dirname "$LOGS")" final-logs
say "done: exit $rc"
exit $rc
