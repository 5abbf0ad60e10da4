# Runs bench --micro-batch-overlap --no-sm-held on the host backend under
# mpiexec and checks the table and the JSON: the micro-batch step at each size
# (two micro-batches of T/2 tokens through the halves on one handle), with the
# step, the fused sequence, communication and compute timed, both ratios, and
# 0 wrong elements in dispatch, combine and the step; --no-sm-held skipped
# with its reason (it needs a GPU), nothing measured.  Times are not judged.
# Usage: cmake -DMPIEXEC=... -DTOOL=... -DJSON=... -P micro_batch_smoke.cmake
file(REMOVE ${JSON})
include(${CMAKE_CURRENT_LIST_DIR}/smoke_checks.cmake)
run_tool(bench --backend host --micro-batch-overlap --no-sm-held -t 2,8
         --hidden 72 --experts 8 --topk 3 --expert-intermediate 16 -w 1 -n 3 --json ${JSON})
require_output("# micro-batch overlap: a step of two micro-batches" "step/max st/fused"
               "# no SM held: skipped: --no-sm-held needs a GPU backend \\(this run: host\\)" "Wrong elements : 0 OK")
# One table row per size, checked: "<tokens> | M(A) M(B) | ... | 0/0/0".
foreach(tokens 2 8)
  if(NOT out MATCHES "\n +${tokens} \\|[^\n]*\\| 0/0/0\n")
    message(FATAL_ERROR "no row for ${tokens} tokens with #wrong 0/0/0")
  endif()
endforeach()
file(READ ${JSON} doc)

foreach(flag micro_batch_overlap no_sm_held)
  require_true(config ${flag})
endforeach()
string(JSON sweep LENGTH "${doc}" results)
if(NOT sweep EQUAL 0)
  message(FATAL_ERROR "results: --micro-batch-overlap replaces the sweep, got ${sweep} sizes")
endif()
string(JSON skipped ERROR_VARIABLE none GET "${doc}" micro_batch_overlap skipped)
if(NOT none)
  message(FATAL_ERROR "micro_batch_overlap.skipped on the host backend: '${skipped}'")
endif()
require_equal(16 micro_batch_overlap expert_intermediate)
string(JSON sizes LENGTH "${doc}" micro_batch_overlap results)
if(NOT sizes EQUAL 2)
  message(FATAL_ERROR "micro_batch_overlap.results: expected 2 sizes (2, 8), got ${sizes}")
endif()
set(expected_tokens 2 8)
foreach(i RANGE 1)
  list(GET expected_tokens ${i} tokens)
  require_equal(${tokens} micro_batch_overlap results ${i} tokens_per_rank)
  math(EXPR half "${tokens} / 2")
  require_equal(${half} micro_batch_overlap results ${i} micro_batch_tokens_per_rank)
  foreach(phase step fused_sequence comm compute)
    require(micro_batch_overlap results ${i} ${phase} avg_us)
    require(micro_batch_overlap results ${i} ${phase} rank_max_p50_us)
  endforeach()
  foreach(ratio step_over_max_comm_compute step_over_fused_sequence)
    require(micro_batch_overlap results ${i} ${ratio})
    if(NOT value GREATER 0)
      message(FATAL_ERROR "micro_batch_overlap.results[${i}].${ratio} = ${value}, expected > 0")
    endif()
  endforeach()
  foreach(b 0 1)
    require(micro_batch_overlap results ${i} micro_batches ${b} bytes dispatch_remote)
    require_equal(32 micro_batch_overlap results ${i} micro_batches ${b} up n)  # 2 * --expert-intermediate
    require_equal(16 micro_batch_overlap results ${i} micro_batches ${b} down k)
  endforeach()
  foreach(wrong wrong_dispatch wrong_combine wrong_step)
    require_equal(0 micro_batch_overlap results ${i} ${wrong})
  endforeach()
endforeach()
require_skipped(no_sm_held "needs a GPU backend")
message("micro-batch JSON ok: ${sizes} sizes, no-sm-held skipped")
