# Runs the C layout probe and saves its output for the Python layout test.
execute_process(COMMAND ${PROBE} OUTPUT_FILE ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "layout probe ${PROBE} failed: ${rc}")
endif()
