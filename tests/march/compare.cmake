# Runs the baseline build of march_probe (writes FILE), then the native one (compares with it).
execute_process(COMMAND ${GENERIC} write ${FILE} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${GENERIC} write ${FILE}: exit ${status}")
endif()
execute_process(COMMAND ${NATIVE} compare ${FILE} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "the -march=native build departs from the baseline build beyond docs/PLATFORMS.md's policy")
endif()
