#!/usr/bin/env bash
# The NCCL backend's pipelining (MOE_EP_NCCL_DISPATCH_CHUNKS / MOE_EP_NCCL_COMBINE_CHUNKS,
# docs/nccl_backend.md) on 2 GPUs, in one device call of at most ~150 s: for N = 1 2 4
# (dispatch and combine both cut into N row ranges) a few representative GPU suite cases on
# the NCCL backend (CUDA graph, bad ids, routing with zero / partial token counts, fp8 rows
# with their scales, mismatched runtime_max_tokens_per_rank) and `bench --backend nccl` at 4096 tokens next to NCCL's own
# grouped send/recv (benches first, then the suite cases with what is left of the budget);
# ends with a table: moe_ep us, NCCL us, ratio moe_ep / NCCL (target <= 1.15), wrong results
# counted by the bench (dispatch/combine), suite outcome.
# Run from the repository root; logs go to $OUT (default ./gpu-out); DEPS = the prefix with
# CLI11, Catch2 and dlpack (default ./.device-deps/usr); BUILD (default build-final) is reused
# when it exists (ninja rebuilds what changed), configured when it does not.
#   usage: OUT=/tmp/out scripts/gpu/nccl_speed.sh [N ...]      (default N: 1 2 4)
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
DEPS=${DEPS:-$PWD/.device-deps/usr}
BUILD=${BUILD:-build-final}
BUDGET=${BUDGET:-145}  # seconds for the whole script; later steps get what is left
CHUNKS=${*:-1 2 4}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
export NCCL_NVLS_ENABLE=0
SUMMARY="$OUT/nccl_speed_summary.txt"
: > "$SUMMARY"
START=$(date +%s)
note() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
# A step's timeout: its own limit or what is left of the budget, whichever is less (0: skip it).
limit() { local l; l=$(left); [ "$l" -lt "$1" ] && echo $(( l > 0 ? l : 0 )) || echo "$1"; }

# NCCL from pip (nvidia-nccl-cu13) unless the caller named a library.
if [ -z "${MOE_EP_NCCL_LIBRARY:-}" ]; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null)
  [ -n "$nccl_root" ] && [ -f "$nccl_root/lib/libnccl.so.2" ] && export MOE_EP_NCCL_LIBRARY="$nccl_root/lib/libnccl.so.2"
fi
note "libnccl: ${MOE_EP_NCCL_LIBRARY:-libnccl.so.2 from the default loader path}"
NCCL_X=(-x NCCL_NVLS_ENABLE -x MOE_EP_TEST_GPU_BACKEND=nccl)
[ -n "${MOE_EP_NCCL_LIBRARY:-}" ] && NCCL_X+=(-x MOE_EP_NCCL_LIBRARY)

t0=$(date +%s)
if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_PREFIX_PATH="$DEPS" > "$OUT/nccl_speed_build.log" 2>&1 || { note "configure failed"; tail -30 "$OUT/nccl_speed_build.log"; exit 1; }
fi
ninja -C "$BUILD" -j32 test_nvlink_gpu moe_ep_conformance >> "$OUT/nccl_speed_build.log" 2>&1
rc=$?
note "build rc=$rc in $(( $(date +%s) - t0 )) s ($BUILD)"
if [ $rc -ne 0 ]; then grep -B2 -A12 -E "error|FAILED" "$OUT/nccl_speed_build.log" | head -60; exit $rc; fi

CASES='[graph],[bad_ids],[peer_counts],token counts*,quantized payloads*'
declare -A D_US C_US ND_US NC_US WRONG SUITE
# Benches first (the measurement this script exists for; each also counts wrong results),
# then the suite cases with what is left of the budget, the new values first.
for n in $CHUNKS; do
  CH=(-x MOE_EP_NCCL_DISPATCH_CHUNKS=$n -x MOE_EP_NCCL_COMBINE_CHUNKS=$n)
  t=$(limit 40)
  [ "$t" -gt 5 ] || { note "chunks=$n bench skipped (time budget)"; continue; }
  timeout "$t" mpirun -np 2 --bind-to none "${NCCL_X[@]}" "${CH[@]}" "$BUILD/tools/moe_ep_conformance" bench \
    --backend nccl --hidden 7168 --topk 8 --experts 256 --dtype bf16 --routing uniform -t 4096 -w 5 -n 30 \
    > "$OUT/nccl_speed_bench_$n.txt" 2>&1
  note "chunks=$n bench rc=$?"
  # Row 1 of 4096: moe_ep (dispatch | combine: nvl_bytes avg ... #wrong); row 2: baselines (nccl disp_us ... comb_us).
  read -r D_US[$n] C_US[$n] WRONG[$n] < <(grep -E '^ +4096 \|' "$OUT/nccl_speed_bench_$n.txt" | sed -n 1p |
    awk -F'|' '{split($2, d, " "); split($3, c, " "); print d[2], c[2], d[9] "/" c[9]}')
  read -r ND_US[$n] NC_US[$n] < <(grep -E '^ +4096 \|' "$OUT/nccl_speed_bench_$n.txt" | sed -n 2p |
    awk -F'|' '{split($3, b, " "); print b[1], b[4]}')
done
for n in $(echo $CHUNKS | tr ' ' '\n' | sort -rn); do
  CH=(-x MOE_EP_NCCL_DISPATCH_CHUNKS=$n -x MOE_EP_NCCL_COMBINE_CHUNKS=$n)
  t=$(limit 40)
  if [ "$t" -gt 5 ]; then
    timeout "$t" mpirun -np 2 --bind-to none "${NCCL_X[@]}" "${CH[@]}" "$BUILD/test/nvlink/test_nvlink_gpu" "$CASES" \
      > "$OUT/nccl_speed_suite_$n.txt" 2>&1
    rc=$?
    SUITE[$n]="rc=$rc $(grep -E 'All tests passed|test cases' "$OUT/nccl_speed_suite_$n.txt" | head -1 | tr -s ' ')"
    [ $rc -ne 0 ] && grep -B3 -A25 -E "FAILED|with expansion|exception" "$OUT/nccl_speed_suite_$n.txt" | head -60
  else
    SUITE[$n]="skipped (time budget)"
  fi
  note "chunks=$n suite ($CASES): ${SUITE[$n]}"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else printf "-" }'; }
{
  echo
  echo "NCCL backend, 2 GPUs, 4096 tokens/rank, hidden 7168 bf16, top-8 of 256 (avg us; ratio = moe_ep / NCCL, target <= 1.15)"
  printf "%-7s | %9s %9s %6s | %9s %9s %6s | %-7s | %s\n" chunks disp_us nccl_us ratio comb_us nccl_us ratio "#wrong" suite
  for n in $CHUNKS; do
    printf "%-7s | %9s %9s %6s | %9s %9s %6s | %-7s | %s\n" "$n" "${D_US[$n]:--}" "${ND_US[$n]:--}" \
      "$(ratio "${D_US[$n]:-}" "${ND_US[$n]:-}")" "${C_US[$n]:--}" "${NC_US[$n]:--}" \
      "$(ratio "${C_US[$n]:-}" "${NC_US[$n]:-}")" "${WRONG[$n]:--}" "${SUITE[$n]:--}"
  done
  echo "total $(( $(date +%s) - START )) s"
} | tee -a "$SUMMARY"
