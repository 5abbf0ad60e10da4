#!/usr/bin/env bash
# The sanitizer CI job, one step per CTest test (see CMakeLists.txt here):
#   run_sanitized.sh build   configure + build the nested sanitized build
#   run_sanitized.sh suite   run its C++ suites
#   run_sanitized.sh fuzz    fuzz the C API for MOE_EP_FUZZ_SECONDS
# Exit 77 = skipped (no clang or no libFuzzer runtime), with the reason.
set -euo pipefail
step=${1:?build, suite or fuzz}
src=${MOE_EP_SOURCE_DIR:?}
dir=${MOE_EP_SANITIZED_DIR:?}
here=$(cd "$(dirname "$0")" && pwd)

# Every report is fatal; leaks of Open MPI's own are suppressed (lsan.supp);
# a failed huge allocation returns NULL (std::bad_alloc) as it does without ASan.
# fast_unwind_on_malloc=0: full stacks through Open MPI (built without frame
# pointers), and Open MPI keeps its components loaded, so that its leaks are
# attributed to its libraries and matched by lsan.supp.
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:fast_unwind_on_malloc=0
export LSAN_OPTIONS=suppressions=$here/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export OMPI_MCA_mca_base_component_disable_dlclose=1

skip() { echo "SKIPPED: $*"; exit 77; }

case "$step" in
  build)
    [ -x "${MOE_EP_CLANG:-}" ] && [ -x "${MOE_EP_CLANGXX:-}" ] || skip "clang not found (Debian: apt-get install clang-14)"
    probe=$(mktemp -d)
    trap 'rm -rf "$probe"' EXIT
    printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' > "$probe/f.cpp"
    "$MOE_EP_CLANGXX" -fsanitize=fuzzer,address,undefined "$probe/f.cpp" -o "$probe/f" >/dev/null 2>&1 ||
      skip "clang cannot link libFuzzer with ASan/UBSan (Debian: apt-get install libclang-rt-14-dev)"
    start=$(date +%s)
    "$CMAKE_COMMAND" -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER="$MOE_EP_CLANG" -DCMAKE_CXX_COMPILER="$MOE_EP_CLANGXX" \
      -DMOE_EP_WITH_CUDA=OFF -DMOE_EP_SANITIZE=address,undefined -DMOE_EP_BUILD_FUZZER=ON \
      -DMOE_EP_BUILD_TOOLS=OFF
    "$CMAKE_COMMAND" --build "$dir" -j"${MOE_EP_SANITIZE_JOBS:-2}"
    echo "sanitized build: $(( $(date +%s) - start )) s"
    ;;
  suite)
    [ -f "$dir/CTestTestfile.cmake" ] || skip "no sanitized build (sanitize_build skipped)"
    "$CTEST_COMMAND" --test-dir "$dir" --output-on-failure
    ;;
  fuzz)
    [ -x "$dir/test/fuzz/fuzz_c_api" ] || skip "no fuzzer (sanitize_build skipped)"
    work=$dir/fuzz_work
    rm -rf "$work" && mkdir -p "$work/new"
    # New inputs go to a scratch directory; the checked-in corpus is only read.
    # -rss_limit_mb bounds memory; libFuzzer exits non-zero on any crash,
    # sanitizer report, leak or timeout of one input (-timeout).
    # -error_exitcode=1: libFuzzer's default (77) would read as "skipped" to CTest.
    (cd "$work" && "$dir/test/fuzz/fuzz_c_api" -max_total_time="${MOE_EP_FUZZ_SECONDS:-60}" -timeout=20 \
       -error_exitcode=1 -timeout_exitcode=1 \
       -rss_limit_mb=2048 -print_final_stats=1 "$work/new" "$src/test/fuzz/corpus")
    ;;
  *)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
