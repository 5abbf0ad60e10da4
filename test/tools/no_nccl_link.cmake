# The conformance tool must not need libnccl to start: NCCL is loaded at run
# time, only for the NCCL backend and baseline.  Fails if any NEEDED entry of
# the executable names NCCL.  -DTOOL=<path>
execute_process(COMMAND readelf -d ${TOOL} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${TOOL} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dynamic}")
foreach(entry ${needed})
  if(entry MATCHES "nccl")
    message(FATAL_ERROR "${TOOL} links NCCL: ${entry}")
  endif()
endforeach()
list(LENGTH needed n)
message(STATUS "${n} NEEDED entries, none is NCCL")
