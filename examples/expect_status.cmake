# cmake -DPROGRAM=path "-DARGS=--steps abc" -DSTATUS=2 [-DOUTPUT=text] -P expect_status.cmake
#
# Runs PROGRAM with ARGS (split like a shell command line) and fails unless it exits with exactly
# STATUS and, if OUTPUT is given, prints OUTPUT (on stdout or stderr). CTest's WILL_FAIL would
# pass a crash as readily as a clean usage error; this tells status 2 from an abort.
separate_arguments(args UNIX_COMMAND "${ARGS}")
execute_process(COMMAND "${PROGRAM}" ${args} RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT "${status}" STREQUAL "${STATUS}")
  message(FATAL_ERROR "${PROGRAM} ${ARGS}: exit status '${status}', expected ${STATUS}\n${out}${err}")
endif()
if(DEFINED OUTPUT)
  string(FIND "${out}${err}" "${OUTPUT}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${PROGRAM} ${ARGS}: output lacks '${OUTPUT}'\n${out}${err}")
  endif()
endif()
