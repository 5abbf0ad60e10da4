# Runs and checks shared by the tool's smoke scripts (bench_smoke.cmake,
# decode_step_smoke.cmake, micro_batch_smoke.cmake): members of the JSON
# document `doc` and lines of the output `out`, both read by the caller.
# Each fails the script with a message naming what it expected.

function(require)  # the JSON member at the path ARGV exists; its value in `value`
  string(JSON value ERROR_VARIABLE error GET "${doc}" ${ARGV})
  if(error)
    message(FATAL_ERROR "JSON member ${ARGV}: ${error}")
  endif()
  set(value "${value}" PARENT_SCOPE)
endfunction()

function(require_equal expected)  # the member at the path ARGN equals `expected` (a number)
  require(${ARGN})
  if(NOT value EQUAL expected)
    string(REPLACE ";" "." path "${ARGN}")
    message(FATAL_ERROR "${path} = ${value}, expected ${expected}")
  endif()
endfunction()

function(require_true)  # the member at the path ARGV is true
  require(${ARGV})
  if(NOT value STREQUAL "ON" AND NOT value STREQUAL "true")
    string(REPLACE ";" "." path "${ARGV}")
    message(FATAL_ERROR "${path}: expected true, got ${value}")
  endif()
endfunction()

# `object` was skipped on the host backend: its reason matches `pattern`, and it measured nothing.
function(require_skipped object pattern)
  require(${object} skipped)
  if(NOT value MATCHES "${pattern}")
    message(FATAL_ERROR "${object}.skipped: '${value}', expected '${pattern}'")
  endif()
  string(JSON measured LENGTH "${doc}" ${object} results)
  if(NOT measured EQUAL 0)
    message(FATAL_ERROR "${object}.results: expected none on the host backend, got ${measured}")
  endif()
endfunction()

function(require_output)  # each argument (a regular expression) matches the output
  foreach(line ${ARGV})
    if(NOT out MATCHES "${line}")
      message(FATAL_ERROR "no '${line}' in the output")
    endif()
  endforeach()
endfunction()

function(run_tool)  # the tool under mpiexec -n 2 with the arguments ARGV; its output in `out`; it must exit 0
  execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${TOOL} ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " shown "${ARGV}")
    message(FATAL_ERROR "moe_ep_conformance ${shown} exited with ${rc}")
  endif()
  set(out "${out}" PARENT_SCOPE)
endfunction()
