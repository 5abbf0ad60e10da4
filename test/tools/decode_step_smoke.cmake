# Runs bench --decode-step --overlap-gemm on the host backend under mpiexec and
# checks the JSON: the decode step at its default sizes (1, 8, 32, 128 tokens
# per rank), each with every phase timed, the step through the split halves
# too (HOST has them), and 0 wrong elements in dispatch, in combine after the
# parts, after the whole step and after the split step; the overlap skipped
# with its reason (it needs a GPU).  Times are not judged.
# Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P decode_step_smoke.cmake
file(REMOVE ${JSON})
include(${CMAKE_CURRENT_LIST_DIR}/smoke_checks.cmake)
run_tool(bench --backend host --decode-step --overlap-gemm --hidden 72
         --experts 8 --topk 3 -w 1 -n 3 --json ${JSON})
require_output("Wrong elements : 0 OK" "split = the same step through the halves" "split/st")
if(out MATCHES "split step: skipped")
  message(FATAL_ERROR "the split step was skipped on the host backend")
endif()
file(READ ${JSON} doc)

require_true(config decode_step)
string(JSON sweep LENGTH "${doc}" results)
if(NOT sweep EQUAL 0)
  message(FATAL_ERROR "results: --decode-step replaces the sweep, got ${sweep} sizes")
endif()
string(JSON sizes LENGTH "${doc}" decode_step results)
if(NOT sizes EQUAL 4)
  message(FATAL_ERROR "decode_step.results: expected 4 sizes (1, 8, 32, 128), got ${sizes}")
endif()
set(expected_tokens 1 8 32 128)
foreach(i RANGE 3)
  list(GET expected_tokens ${i} tokens)
  require_equal(${tokens} decode_step results ${i} tokens_per_rank)
  foreach(phase dispatch expert combine parts_sum step split_step)
    require(decode_step results ${i} ${phase} avg_us)
  endforeach()
  require(decode_step results ${i} step_over_parts_sum)
  require(decode_step results ${i} split_over_step)
  foreach(wrong wrong_dispatch wrong_parts wrong_step wrong_split_step)
    require_equal(0 decode_step results ${i} ${wrong})
  endforeach()
endforeach()
require_skipped(overlap "needs a GPU backend")
message("decode step JSON ok: ${sizes} sizes, overlap skipped")
