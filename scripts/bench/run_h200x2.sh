#!/usr/bin/env bash
# The 2-GPU conformance check and benchmark behind docs/performance.md.
# Run from the repository root on a 2-GPU NVLink machine (the project's
# nvidia-h200-x2 device, with .device-deps/ carried along):
#   OUT=/some/dir bash scripts/bench/run_h200x2.sh
# Writes under $OUT: run.log (everything printed), build.log, the JSON of each
# bench run and, where matplotlib is installed, bench_h200x2.png from
#   tools/plot_bench.py bench_graph.json bench_eager.json bench_eager_host.json bench_sms16.json
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
LOG=$OUT/run.log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0   # never NVLink multicast on these machines
export PYTHONUNBUFFERED=1

say() { echo "### $*" | tee -a "$LOG"; }

# NCCL from pip (nvidia-nccl-cu13) when present; the tool builds without it too.
NCCL_ROOT=$(python3 - <<'PY' 2>/dev/null
import nvidia.nccl as n
print(list(n.__path__)[0])
PY
)
say "commit $(git rev-parse --short HEAD 2>/dev/null), nccl root '${NCCL_ROOT}'"
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version --format=csv 2>&1 | tee -a "$LOG"
nvidia-smi topo -m 2>&1 | tee -a "$LOG"

say "build"
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" -DMOE_EP_BUILD_TESTS=OFF \
  ${NCCL_ROOT:+-DMOE_EP_NCCL_ROOT="$NCCL_ROOT"} >"$OUT/build.log" 2>&1 &&
  ninja -C build-bench -j"$(nproc)" moe_ep_conformance >>"$OUT/build.log" 2>&1
status=$?
grep -E "NCCL|moe_ep_conformance" "$OUT/build.log" | tee -a "$LOG"
if [ $status -ne 0 ]; then
  tail -40 "$OUT/build.log" | tee -a "$LOG"
  exit $status
fi
TOOL=build-bench/tools/moe_ep_conformance
MPIRUN="mpirun -np 2 --bind-to none"
rc=0
run() {  # run NAME SECONDS ARGS...: one step; a failure is logged and the next step still runs
  local name=$1 limit=$2
  shift 2
  say "$name: $*"
  timeout "$limit" $MPIRUN "$TOOL" "$@" 2>&1 | tee -a "$LOG"
  local s=${PIPESTATUS[0]}
  say "$name: exit $s"
  [ "$s" -eq 0 ] || rc=1
}

DEEPSEEK="--hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform"
run check 90 check --backend nvlink
run bench_eager 75 bench --backend nvlink $DEEPSEEK -t 1,128,512,4096 -w 10 -n 50 --json "$OUT/bench_eager.json"
run bench_eager_host 75 bench --backend nvlink $DEEPSEEK -t 1,128,512,4096 -w 10 -n 50 --no-launch-gate \
  --json "$OUT/bench_eager_host.json"
run bench_graph 75 bench --backend nvlink $DEEPSEEK -t 1,128,512,4096 -w 10 -n 50 --graph --json "$OUT/bench_graph.json"
run bench_sms16 45 bench --backend nvlink $DEEPSEEK -t 4096 --num-sms 16 -w 10 -n 50 --graph --json "$OUT/bench_sms16.json"
if python3 -c "import matplotlib" 2>/dev/null; then
  jsons=$(ls "$OUT"/bench_graph.json "$OUT"/bench_eager.json "$OUT"/bench_eager_host.json "$OUT"/bench_sms16.json \
    2>/dev/null)
  [ -n "$jsons" ] && python3 tools/plot_bench.py $jsons -o "$OUT/bench_h200x2.png" 2>&1 | tee -a "$LOG"
fi
say "done, exit $rc"
exit $rc
