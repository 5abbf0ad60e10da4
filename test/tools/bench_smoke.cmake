# Runs a small host-backend bench under mpiexec and checks that its JSON
# parses and holds what the docs promise: the machine, the formulas, one
# result per size with both phases, and 0 wrong elements; and that neither the
# table nor the JSON speaks of NVLink.  Times are not
# judged.  Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P bench_smoke.cmake
file(REMOVE ${JSON})
include(${CMAKE_CURRENT_LIST_DIR}/smoke_checks.cmake)
run_tool(bench --backend host -b 1 -e 64 -f 8 --hidden 96
         --experts 8 --topk 3 --routing zipf -w 1 -n 3 --json ${JSON})
# The HOST backend moves nothing over NVLink: its output must not say so.
string(REGEX MATCH "NVLink|nvl_" nvlink_words "${out}")
if(nvlink_words)
  message(FATAL_ERROR "host-backend bench output mentions '${nvlink_words}'")
endif()
if(NOT EXISTS ${JSON})
  message(FATAL_ERROR "bench wrote no ${JSON}")
endif()
file(READ ${JSON} doc)
string(REGEX MATCH "NVLink|_nvl" nvlink_words "${doc}")
if(nvlink_words)
  message(FATAL_ERROR "host-backend bench JSON mentions '${nvlink_words}'")
endif()

require_equal(2 machine ranks)
require(config routing)
if(NOT value STREQUAL "zipf")
  message(FATAL_ERROR "config.routing: expected zipf, got ${value}")
endif()
require(formulas 0)
string(JSON sizes LENGTH "${doc}" results)
if(NOT sizes EQUAL 3)  # -b 1 -e 64 -f 8: 1, 8 and 64 tokens per rank
  message(FATAL_ERROR "results: expected 3 sizes, got ${sizes}")
endif()
math(EXPR last "${sizes} - 1")
foreach(i RANGE ${last})
  foreach(phase dispatch combine)
    require(results ${i} moe_ep ${phase} avg_us)
    require(results ${i} moe_ep ${phase} busbw_GBps)
    require(results ${i} moe_ep ${phase} rank_max_p50_us)
    require_equal(0 results ${i} moe_ep wrong_${phase})
  endforeach()
  require(results ${i} bytes dispatch_remote)
endforeach()
message("bench JSON ok: ${sizes} sizes")
