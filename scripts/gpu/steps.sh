# shellcheck shell=bash
# Sourced by scripts/gpu/validate.sh, bench.sh and ab.sh: the environment every
# GPU run needs and the functions they share.  Run from the repository root.
#
#   step NAME LIMIT CMD...   runs CMD with a timeout of LIMIT seconds, or of what
#       is left of BUDGET seconds since the start (skipped under 15 s).  Its whole
#       output goes to $OUT/logs/NAME.log; one line per step goes to
#       $OUT/summary.txt: exit status, seconds, and the last $NPICK (default 2)
#       lines of the output that match $PICK (default: test and sanitizer
#       verdicts).  A failing step sets rc=1 and prints the end of its output.
#       A skipped test (exit 77) counts as a pass.
#   build_tree NAME SOURCE_DIR BUILD_DIR [TARGET...]   the step NAME: configures
#       BUILD_DIR from SOURCE_DIR (Release, compute capability $CUDA_ARCH,
#       dependencies from $DEPS) and builds the targets (all of them without any)
#       with ninja -j$JOBS.
#   build_step [TARGET...]   build_tree "build" of this tree in $BUILD.
#   bench_compare LABEL_A "A.json..." LABEL_B "B.json..."   prints, per token
#       count, the dispatch and combine times (each iteration's slower rank,
#       averaged; the median over the files of one side) and B's difference
#       from A in per cent.
#   finish   prints the total time and exits with rc.
#
# Settings (environment): OUT (default ./gpu-out), BUILD (default build-gpu),
# DEPS (default ./.device-deps/usr: the CLI11, Catch2 v2 and dlpack headers for
# a machine without them, see docs/contributing.md), CUDA_ARCH (default 90),
# JOBS (default 32), BUDGET (seconds for the whole script, default 3600).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=sh
# NVLink multicast (NVLS) stays off: the bench's NCCL baseline is plain NCCL send/recv.
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-out}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
mkdir -p "$OUT/logs"
BUILD=${BUILD:-build-gpu}
DEPS=${DEPS:-$PWD/.device-deps/usr}
SUMMARY=$OUT/summary.txt
BUDGET=${BUDGET:-3600}
START=$(date +%s)
rc=0
: > "$SUMMARY"

# NCCL is loaded at run time; without a system libnccl.so.2, take pip's
# (nvidia-nccl-cu*) when Python has it.
if ! ldconfig -p 2> /dev/null | grep -q libnccl.so.2; then
  nccl_root=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2> /dev/null)
  [ -n "$nccl_root" ] && export LD_LIBRARY_PATH="$nccl_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
{
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo "(not a git checkout)")"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1
} | tee -a "$SUMMARY"

step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 15 ]; then
    echo "$name: SKIPPED (budget)" | tee -a "$SUMMARY"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0 log s picked
  t0=$(date +%s)
  log="$OUT/logs/$name.log"
  timeout -k 5 "$limit" "$@" > "$log" 2>&1
  s=$?
  picked=$(grep -hE "${PICK:-All tests passed|test cases|passed, |ERROR SUMMARY|RACECHECK SUMMARY|tests passed|skipped}" "$log" |
    tail -"${NPICK:-2}" | tr '\n' ' ')
  echo "$name: exit $s in $(($(date +%s) - t0)) s | $picked" | tee -a "$SUMMARY"
  [ "$s" -eq 0 ] || [ "$s" -eq 77 ] || { rc=1; tail -25 "$log"; }
}

build_tree() {
  local name=$1 src=$2 dir=$3
  shift 3
  PICK="Linking|error" step "$name" 1200 bash -c "cmake -S '$src' -B '$dir' -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DCMAKE_PREFIX_PATH='$DEPS' && ninja -C '$dir' -j${JOBS:-32} $*"
}

build_step() { build_tree build . "$BUILD" "$@"; }

bench_compare() {
  python3 - "$@" << 'EOF'
import json
import statistics
import sys

label_a, paths_a, label_b, paths_b = sys.argv[1:5]


def times(paths):
    """{tokens: {phase: median over the files of the average time}}"""
    samples = {}
    for path in paths.split():
        with open(path) as f:
            doc = json.load(f)
        for r in doc["results"]:
            for p in ("dispatch", "combine"):
                if "moe_ep" in r:
                    samples.setdefault(r["tokens_per_rank"], {}).setdefault(p, []).append(r["moe_ep"][p]["avg_us"])
    return {t: {p: statistics.median(v) for p, v in ps.items()} for t, ps in samples.items()}


a, b = times(paths_a), times(paths_b)
head = f"{label_a:>10} {label_b:>10} {'diff':>7}"
print(f"{'tokens':>7} | dispatch, us {head} | combine, us {head}")
for t in sorted(set(a) & set(b)):
    cells = [f"{a[t][p]:10.2f} {b[t][p]:10.2f} {100 * (b[t][p] - a[t][p]) / a[t][p]:+6.1f}%" for p in ("dispatch", "combine")]
    print(f"{t:>7} | {'':12} {cells[0]} | {'':11} {cells[1]}")
EOF
}

finish() {
  echo "total $(($(date +%s) - START)) s, exit $rc" | tee -a "$SUMMARY"
  exit $rc
}
