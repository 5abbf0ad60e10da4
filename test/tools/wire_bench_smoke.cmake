# Runs a small host-backend bench with every wire format (--wire all) and
# checks its JSON: one result per (wire, size) with the wire named, both
# phases with 0 wrong elements, the bytes per row that cross counted from the
# wire (an FP8 direction: R codes + ceil(R / 128) fp32 scales, here R = 200:
# 208 bytes instead of 400 of bf16), and the reference quantize kernel
# (quantize+as_is) reported skipped on the host backend, which has no CUDA
# kernels.  A second run takes UE8M0 scales with dequantized rows: the same
# bytes cross.  Times are not judged.
# Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P wire_bench_smoke.cmake
include(${CMAKE_CURRENT_LIST_DIR}/smoke_checks.cmake)

# The result `i` of `doc`: wire `wire`, rows of `dispatch_row` and `combine_row` bytes, nothing wrong.
function(require_wire_result i wire dispatch_row combine_row)
  require(results ${i} wire)
  if(NOT value STREQUAL wire)
    message(FATAL_ERROR "results.${i}.wire: '${value}', expected '${wire}'")
  endif()
  require_equal(${dispatch_row} results ${i} bytes dispatch_row)
  require_equal(${combine_row} results ${i} bytes combine_row)
  foreach(phase dispatch combine)
    require(results ${i} moe_ep ${phase} avg_us)
    require_equal(0 results ${i} moe_ep wrong_${phase})
  endforeach()
endfunction()

file(REMOVE ${JSON})
run_tool(bench --backend host --wire all -b 1 -e 16 -f 4 --hidden 200 --experts 8 --topk 3 -w 1 -n 2 --json ${JSON})
if(NOT EXISTS ${JSON})
  message(FATAL_ERROR "bench wrote no ${JSON}")
endif()
file(READ ${JSON} doc)
string(JSON results LENGTH "${doc}" results)
if(NOT results EQUAL 9)  # 3 wires x (1, 4 and 16 tokens per rank)
  message(FATAL_ERROR "results: expected 9 (3 wires x 3 sizes), got ${results}")
endif()
foreach(i 0 1 2)
  require_wire_result(${i} as_is 400 400)
endforeach()
foreach(i 3 4 5)
  require_wire_result(${i} fp8 208 208)
endforeach()
foreach(i 6 7 8)
  require_wire_result(${i} fp8_dispatch 208 400)
endforeach()
require(wires_skipped quantize+as_is)
if(NOT value MATCHES "GPU backend")
  message(FATAL_ERROR "wires_skipped.quantize+as_is: '${value}', expected the reason (a GPU backend is needed)")
endif()
if(NOT out MATCHES "wires side by side")
  message(FATAL_ERROR "bench --wire all printed no side-by-side table of the wires")
endif()

file(REMOVE ${JSON})
run_tool(bench --backend host --wire fp8 --wire-scale ue8m0 --dispatch-dequantize -t 8 --hidden 200 --experts 8
         --topk 3 -w 1 -n 2 --json ${JSON})
file(READ ${JSON} doc)
require_wire_result(0 fp8 208 208)
require(config wire_scale)
if(NOT value STREQUAL "ue8m0")
  message(FATAL_ERROR "config.wire_scale: '${value}', expected 'ue8m0'")
endif()
require_true(config dispatch_dequantize)
message("wire bench JSON ok")
