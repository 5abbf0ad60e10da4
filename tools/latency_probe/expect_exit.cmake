# Runs PROBE with one argument ARG and fails unless it exits with EXPECT_EXIT
# and its output (stdout and stderr) matches the regular expression
# EXPECT_OUTPUT.  -DPROBE=<path> -DARG=<argument> -DEXPECT_EXIT=<n> -DEXPECT_OUTPUT=<regex>
execute_process(COMMAND ${PROBE} ${ARG} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 50)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "${PROBE} ${ARG}: exit status ${rc}, expected ${EXPECT_EXIT}; output:\n${all}")
endif()
if(NOT all MATCHES "${EXPECT_OUTPUT}")
  message(FATAL_ERROR "${PROBE} ${ARG}: output does not match '${EXPECT_OUTPUT}':\n${all}")
endif()
message(STATUS "exit ${rc} and the expected output: ${all}")
