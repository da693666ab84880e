# cmake -DPROGRAM=path -P expect_width.cmake
#
# Runs PROGRAM --help and fails unless it exits 0 and every line of its text fits in 100 columns
# (bytes, a bound on characters).
execute_process(COMMAND "${PROGRAM}" --help RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${status}" STREQUAL "0")
  message(FATAL_ERROR "${PROGRAM} --help: exit status '${status}', expected 0\n${out}${err}")
endif()
string(REPLACE ";" "\\;" out "${out}")
string(REPLACE "\n" ";" lines "${out}")
foreach(line IN LISTS lines)
  string(LENGTH "${line}" length)
  if(length GREATER 100)
    message(FATAL_ERROR "${PROGRAM} --help: a line of ${length} columns (at most 100):\n${line}")
  endif()
endforeach()
