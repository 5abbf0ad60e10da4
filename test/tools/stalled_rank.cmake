# A rank that stops answering (check --inject-fault stalled_rank: the last
# rank stops before the first outcome agreement) must not leave the tool
# hanging in its own collective: rank 0 aborts the job within --timeout-ms +
# 5 s, with a message naming the phase.  Usage: cmake -DMPIEXEC=... -DTOOL=... -P stalled_rank.cmake
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND ${MPIEXEC} -n 2 --oversubscribe ${TOOL} check --backend host --filter tokens_full --timeout-ms 1000
          --inject-fault stalled_rank
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
message("${out}${err}\nexit ${rc} after ${seconds} s")
if(rc EQUAL 0 OR rc MATCHES "timeout")
  message(FATAL_ERROR "the tool did not abort (exit ${rc})")
endif()
if(NOT err MATCHES "rank 0: check, case [^:]+: agreeing on its outcome: the tool's MPI_Iallreduce did not complete within 6000 ms")
  message(FATAL_ERROR "no message naming the phase and the bound")
endif()
if(seconds GREATER 40)
  message(FATAL_ERROR "took ${seconds} s; the bound is 6 s plus start-up")
endif()
