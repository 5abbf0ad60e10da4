# Runs the tool under mpiexec -n 2 with each bad argument: every one must end
# with one line naming the flag, what was expected and what was given, and
# exit code 2 (the same on every rank, so mpiexec's exit code is 2 too).
# Each case: "<arguments>|<regular expression of the line>".
# Usage: cmake -DMPIEXEC=... -DTOOL=... -P bad_arguments.cmake
set(cases
  "bench --hidden 0|--hidden: expected an integer >= 1, got '0'"
  "bench --topk 0|--topk: expected an integer >= 1, got '0'"
  "bench -n 0|--iters: expected an integer >= 1, got '0'"
  "bench -t 5,-3|--tokens: expected an integer >= 1, got '-3'"
  "bench -t 0|--tokens: expected an integer >= 1, got '0'"
  "bench -t -5|--tokens: expected an integer >= 1, got '-5'"
  "bench --hidden 12x|--hidden: expected an integer >= 1, got '12x'"
  "bench --mask 1.5|--mask: expected a number >= 0.0 and <= 1.0, got '1.5'"
  "bench -b 64 -e 8|-b/--min-tokens: expected at most -e/--max-tokens \\(8\\), got 64"
  "bench --timeout-ms 0|--timeout-ms: expected an integer from 1 to 86400000, got '0'"
  "check --backend host --filter nomatch|--filter: expected a part of some case's name \\(see check --list\\), got 'nomatch'"
  "check --rounds 0|--rounds: expected an integer from 1 to 1000, got '0'"
  "bench --micro-batch-overlap -t 4,3|--micro-batch-overlap: each size is split into two micro-batches of T/2 tokens per rank: expected even sizes >= 2, got 3"
  "bench --micro-batch-overlap --zero-copy-combine|--zero-copy-combine: expected without --micro-batch-overlap \\(its combine takes the tool's expert output\\), got both"
  "bench --no-sm-held --zero-copy-combine|--zero-copy-combine: expected without --no-sm-held \\(its combine takes the tool's expert output\\), got both"
  "bench --expert-intermediate 0|--expert-intermediate: expected an integer from 1 to 131072, got '0'"
  "bench --expert-capacity -1|--expert-capacity: expected auto or an integer >= 0, got '-1'"
  "bench --expert-packed-rows most|--expert-packed-rows: expected auto or an integer >= 0, got 'most'")
set(failures "")
foreach(c ${cases})
  string(FIND "${c}" "|" bar)
  string(SUBSTRING "${c}" 0 ${bar} argv)
  math(EXPR after "${bar} + 1")
  string(SUBSTRING "${c}" ${after} -1 expected)
  separate_arguments(parts UNIX_COMMAND "${argv}")
  execute_process(COMMAND ${MPIEXEC} -n 2 --oversubscribe ${TOOL} ${parts}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  set(text "${out}${err}")
  string(REPLACE ";" " " shown "${parts}")
  message("${shown}: exit ${rc}: ${err}")
  if(NOT rc EQUAL 2)
    string(APPEND failures "${shown}: exit code ${rc}, expected 2\n")
  endif()
  if(NOT text MATCHES "moe_ep_conformance: ${expected}")
    string(APPEND failures "${shown}: no line 'moe_ep_conformance: ${expected}' in:\n${text}\n")
  endif()
  string(REGEX MATCHALL "moe_ep_conformance: [^\n]*" lines "${err}")
  list(LENGTH lines n)
  if(NOT n EQUAL 1)
    string(APPEND failures "${shown}: ${n} lines from the tool on stderr, expected one (rank 0's)\n")
  endif()
endforeach()
if(failures)
  message(FATAL_ERROR "${failures}")
endif()
