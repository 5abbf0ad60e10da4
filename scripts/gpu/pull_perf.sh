#!/usr/bin/env bash
# One device call (2 GPUs) for the performance of this session's NVLink work:
# the zero-copy pull combine (bulk copies), Programmatic Dependent Launch, and
# the SM-budget targets.  DeepSeek shape (hidden 7168 bf16, top-8 of 256,
# uniform), CUDA-graph replays, GPU time, slower rank:
#   1. bench --zero-copy-combine at 1,128,512,4096 tokens with the baselines
#      (copy-engine ceiling C, NCCL): the run the targets are judged on;
#   2. the same without --zero-copy-combine (push combine), no baselines;
#   3. 512 and 4096 tokens at num_sms 24, 16, 8, pull and push;
#   4. the pull combine with its partials loaded into registers
#      (MOE_EP_PULL_LOADS=registers) against bulk copies, 16 SMs and all.
#   usage: OUT=/dir bash scripts/gpu/pull_perf.sh [BUDGET_S]
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
BUDGET=${1:-400}
START=$(date +%s)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh NCCL_NVLS_ENABLE=0
BUILD=${BUILD:-build-final}
SUMMARY=$OUT/perf_summary.txt
: > "$SUMMARY"
if [ -z "${MOE_EP_NCCL_LIBRARY:-}" ]; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "$(nvidia-smi -L | wc -l) GPU(s)" | tee -a "$SUMMARY"
if [ ! -x $BUILD/tools/moe_ep_conformance ]; then
  cmake -S . -B $BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="$PWD/.device-deps/usr" > "$OUT/perf_build.log" 2>&1 &&
    ninja -C $BUILD -j32 moe_ep_conformance >> "$OUT/perf_build.log" 2>&1 || { tail -30 "$OUT/perf_build.log"; exit 1; }
fi
TOOL=$BUILD/tools/moe_ep_conformance
MPI2="mpirun -np 2 --bind-to none"
B="bench --backend nvlink --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -w 10 -n 50"
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
bench() {  # NAME LIMIT ARGS...
  local name=$1 limit=$2
  shift 2
  local l; l=$(left)
  [ "$l" -lt 15 ] && { echo "$name: SKIPPED (budget)" | tee -a "$SUMMARY"; return; }
  [ "$limit" -gt "$l" ] && limit=$l
  echo "===== $name" >> "$SUMMARY"
  timeout -k 5 "$limit" $MPI2 "$@" > "$OUT/$name.log" 2>&1
  echo "exit $?" >> "$SUMMARY"
  grep -E "^ *[0-9]+ |#wrong|ceiling|NCCL" "$OUT/$name.log" | head -20 >> "$SUMMARY"
}
bench pull_graph 90 $TOOL $B -t 1,128,512,4096 --graph --zero-copy-combine -J "$OUT/bench_pull_graph.json"
bench push_graph 60 $TOOL $B -t 1,128,512,4096 --graph --no-baselines
for sms in 24 16 8; do
  bench pull_sms$sms 40 $TOOL $B --num-sms $sms -t 512,4096 --graph --no-baselines --zero-copy-combine
  bench push_sms$sms 40 $TOOL $B --num-sms $sms -t 512,4096 --graph --no-baselines
done
bench pull_registers_sms16 40 env MOE_EP_PULL_LOADS=registers $TOOL $B --num-sms 16 -t 4096 --graph --no-baselines --zero-copy-combine
bench pull_registers_all 40 env MOE_EP_PULL_LOADS=registers $TOOL $B -t 4096 --graph --no-baselines --zero-copy-combine
echo "total $(( $(date +%s) - START )) s" | tee -a "$SUMMARY"
cat "$SUMMARY"
