# Runs a small host-backend bench in every receive layout (--layout all) and
# checks its JSON: one result per (layout, size) with the layout named, both
# phases with 0 wrong elements, and the reference permute (rank_major+user)
# reported skipped on the host backend, which has no CUDA kernels; the expert
# layouts sized from the routing by default (the headings say how), and the
# worst case with --expert-capacity 0 / --expert-packed-rows 0.  Times are
# not judged.  Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P layouts_bench_smoke.cmake
file(REMOVE ${JSON})
include(${CMAKE_CURRENT_LIST_DIR}/smoke_checks.cmake)
run_tool(bench --backend host --layout all --expert-alignment 4 -b 1 -e 16 -f 4 --hidden 96
         --experts 8 --topk 3 -w 1 -n 2 --json ${JSON})
if(NOT EXISTS ${JSON})
  message(FATAL_ERROR "bench wrote no ${JSON}")
endif()
require_output("# layout expert_major: capacity [0-9]+ rows per expert \\(auto: the most rows an expert receives, [0-9]+ at 16 tokens, rounded up to 4"
               "# layout expert_packed: alignment 4, [0-9]+ rows \\(auto: ")
file(READ ${JSON} doc)
require_true(config expert_capacity_auto)
require(config expert_capacity)
if(NOT value GREATER 0 OR NOT value LESS 32)  # 2 ranks x 16 tokens: the worst case, which 24 picks per rank do not need
  message(FATAL_ERROR "config.expert_capacity: ${value}, expected what the routing needs, below the worst case 32")
endif()
require(config expert_packed_rows)
if(NOT value GREATER 0)
  message(FATAL_ERROR "config.expert_packed_rows: ${value}, expected the rows the routing fills")
endif()
string(JSON results LENGTH "${doc}" results)
if(NOT results EQUAL 9)  # 3 layouts x (1, 4 and 16 tokens per rank)
  message(FATAL_ERROR "results: expected 9 (3 layouts x 3 sizes), got ${results}")
endif()
set(seen "")
math(EXPR last "${results} - 1")
foreach(i RANGE ${last})
  require(results ${i} layout)
  list(APPEND seen "${value}")
  foreach(phase dispatch combine)
    require(results ${i} moe_ep ${phase} avg_us)
    require_equal(0 results ${i} moe_ep wrong_${phase})
  endforeach()
endforeach()
foreach(layout rank_major expert_major expert_packed)
  list(FIND seen ${layout} at)
  if(at EQUAL -1)
    message(FATAL_ERROR "results: no result in layout ${layout} (layouts seen: ${seen})")
  endif()
endforeach()
require(layouts_skipped rank_major+user)
if(NOT value MATCHES "GPU backend")
  message(FATAL_ERROR "layouts_skipped.rank_major+user: '${value}', expected the reason (a GPU backend is needed)")
endif()
message("layouts bench JSON ok: ${results} results")

# The worst case when asked for: 0 is passed to the library.
file(REMOVE ${JSON})
run_tool(bench --backend host --layout expert_major --expert-capacity 0 -b 1 -e 16 -f 4 --hidden 96 --experts 8
         --topk 3 -w 1 -n 2 --json ${JSON})
require_output("# layout expert_major: capacity 32 rows per expert \\(the worst case, world x max tokens\\)")
file(READ ${JSON} doc)
require_equal(0 config expert_capacity)
require_equal(0 results 0 moe_ep wrong_dispatch)
require_equal(0 results 0 moe_ep wrong_combine)
message("layouts bench: expert layouts sized from the routing, and the worst case with 0")
