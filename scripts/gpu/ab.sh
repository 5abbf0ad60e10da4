#!/usr/bin/env bash
# An A/B on one GPU machine, from the repository root: two trees, or two
# settings of one tree, timed by moe_ep_conformance bench in one run, the
# sides alternated (A B A B ...) so that drift of the machine hits both alike.
# Side B is this tree; side A is another tree when A_TREE is set, else this one.
#   A_TREE=DIR      the other tree's sources: a directory (e.g. .ab_base/ made by
#                   `git worktree add .ab_base REV` or
#                   `mkdir .ab_base && git archive REV | tar -x -C .ab_base`), or a
#                   revision of this checkout, unpacked into .ab_base/ with git archive
#   A_ENV, B_ENV    "VAR=VALUE ..." set on every rank of that side (docs/api.md lists
#                   the library's variables)
#   ROUNDS          rounds of A then B (default 3)
#   NP              ranks (default 2)
#   TOKENS          tokens per rank (default 128,512,4096)
#   BENCH_ARGS      bench options for both sides (default: the DeepSeek shape, CUDA
#                   graph, zero-copy combine; --no-baselines is always added)
#   usage: OUT=/dir A_TREE=.ab_base bash scripts/gpu/ab.sh
#          OUT=/dir A_ENV="MOE_EP_SMALL_BATCH=0" bash scripts/gpu/ab.sh
# Prints the median over the rounds of each side's dispatch and combine times,
# and B's difference in per cent; every round's JSON is kept under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
source scripts/gpu/steps.sh

A_TREE=${A_TREE:-}
if [ -n "$A_TREE" ] && [ ! -d "$A_TREE" ]; then
  rev=$A_TREE
  A_TREE=.ab_base
  rm -rf "$A_TREE" && mkdir -p "$A_TREE" && git archive "$rev" | tar -x -C "$A_TREE" ||
    { echo "A_TREE=$rev: neither a directory nor a revision of this checkout" >&2; exit 2; }
fi
build_step moe_ep_conformance
TOOL_B=$BUILD/tools/moe_ep_conformance
TOOL_A=$TOOL_B
if [ -n "$A_TREE" ]; then
  build_tree build_a "$A_TREE" "$BUILD-a" moe_ep_conformance
  TOOL_A=$BUILD-a/tools/moe_ep_conformance
fi
[ -x "$TOOL_A" ] && [ -x "$TOOL_B" ] || finish

side() {  # side NAME TOOL "VAR=VALUE ..." ROUND
  local xs=() kv
  for kv in $3; do xs+=(-x "$kv"); done
  NPICK=${NPICK:-8} PICK="^ +[0-9]+ \|" step "$1_$4" 300 mpirun -np "${NP:-2}" --oversubscribe --bind-to none \
    "${xs[@]}" "$2" bench --backend nvlink ${BENCH_ARGS:---hidden 7168 --topk 8 --experts 256 --dtype bf16 \
    --routing uniform --graph --zero-copy-combine} -t "${TOKENS:-128,512,4096}" -w 10 -n 50 --no-baselines \
    --json "$OUT/$1_$4.json"
}
files_a="" files_b=""
for round in $(seq "${ROUNDS:-3}"); do
  side a "$TOOL_A" "${A_ENV:-}" "$round"
  side b "$TOOL_B" "${B_ENV:-}" "$round"
  [ -s "$OUT/a_$round.json" ] && files_a+=" $OUT/a_$round.json"
  [ -s "$OUT/b_$round.json" ] && files_b+=" $OUT/b_$round.json"
done
if [ -n "$files_a" ] && [ -n "$files_b" ]; then
  echo "A: ${A_TREE:-this tree} ${A_ENV:-}; B: this tree ${B_ENV:-}" | tee -a "$SUMMARY"
  bench_compare A "$files_a" B "$files_b" | tee -a "$SUMMARY"
fi
finish
