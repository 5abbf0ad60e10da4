# Runs a small host-backend bench under mpiexec and checks that its JSON
# parses and holds what the docs promise: the machine, the formulas, one
# result per size with both phases, and 0 wrong elements; and that neither the
# table nor the JSON speaks of NVLink.  Times are not
# judged.  Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P bench_smoke.cmake
file(REMOVE ${JSON})
execute_process(
  COMMAND ${MPIEXEC} -n 2 --oversubscribe ${TOOL} bench --backend host -b 1 -e 64 -f 8 --hidden 96
          --experts 8 --topk 3 --routing zipf -w 1 -n 3 --json ${JSON}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench exited with ${rc}")
endif()
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

function(require)  # fails unless the JSON member at the path ARGV exists
  string(JSON value ERROR_VARIABLE error GET "${doc}" ${ARGV})
  if(error)
    message(FATAL_ERROR "JSON member ${ARGV}: ${error}")
  endif()
  set(value "${value}" PARENT_SCOPE)
endfunction()

require(machine ranks)
if(NOT value EQUAL 2)
  message(FATAL_ERROR "machine.ranks: expected 2, got ${value}")
endif()
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
    require(results ${i} moe_ep wrong_${phase})
    if(NOT value EQUAL 0)
      message(FATAL_ERROR "results[${i}].moe_ep.wrong_${phase} = ${value}")
    endif()
  endforeach()
  require(results ${i} bytes dispatch_remote)
endforeach()
message("bench JSON ok: ${sizes} sizes")
