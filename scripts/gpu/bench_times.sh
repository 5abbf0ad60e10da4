# Sourced by the scripts in scripts/gpu/: times dispatch and combine with
# `moe_ep_conformance bench` (which replaced the old moe_ep_nvlink_timing),
# eager and as CUDA-graph replays, on 2 ranks, and prints one line:
#   eager: dispatch <p50> us <busbw> GB/s combine <p50> us <busbw> GB/s | graph: ...
# (p50 over iterations of the slowest rank's time; busbw from nvl_bytes).
#   usage: bench_times BUILD_DIR TOKENS ITERS [extra bench flags...]
# mpirun flags can be passed in the array BENCH_MPI_FLAGS (e.g. -x VAR=value).
[ -n "${BENCH_MPI_FLAGS+x}" ] || BENCH_MPI_FLAGS=()
bench_times() {
  local build=$1 tokens=$2 iters=$3
  shift 3
  local mode line out=""
  for mode in eager graph; do
    line=$(timeout 120 mpirun -np 2 --bind-to none --oversubscribe "${BENCH_MPI_FLAGS[@]}" \
        "$build/tools/moe_ep_conformance" bench --backend nvlink -t "$tokens" -n "$iters" -w 20 \
        --hidden 7168 --experts 256 --topk 8 --no-baselines $([ $mode = graph ] && echo -G) "$@" 2>&1 |
      tee -a "${OUT:-.}/timing.log" | awk -v t="$tokens" '$1 == t && $2 == "|" {print}')
    # columns: tokens | nvl_bytes avg p50 p99 rmin rmax algbw busbw #wrong | (the same for combine)
    out+=$(echo "$line" | awk -v m=$mode '{printf "%s: dispatch %s us %s GB/s combine %s us %s GB/s wrong %s/%s | ",
                                                m, $5, $10, $15, $20, $11, $21}')
  done
  echo "$out"
}
