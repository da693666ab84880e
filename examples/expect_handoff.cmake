# cmake -DPROGRAM=path -DDIR=dir -P expect_handoff.cmake
#
# snapshot_handoff across two processes: `prefill` writes a model snapshot, `decode` restores it into
# another model and decodes; `local` does the same without moving. The two must print the same CRC
# line (the restored sequence continues bit-identically), and a model of another layer count must
# refuse the snapshot.
set(file "${DIR}/handoff_model.snapshot")
execute_process(COMMAND "${PROGRAM}" prefill "${file}" --prompt 300 --layers 4 RESULT_VARIABLE status ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "prefill: exit status ${status}\n${err}")
endif()
execute_process(COMMAND "${PROGRAM}" decode "${file}" --steps 5 --layers 4 RESULT_VARIABLE status OUTPUT_VARIABLE decoded
                ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "decode: exit status ${status}\n${err}")
endif()
execute_process(COMMAND "${PROGRAM}" local --prompt 300 --steps 5 --layers 4 RESULT_VARIABLE status OUTPUT_VARIABLE local
                ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "local: exit status ${status}\n${err}")
endif()
if(NOT decoded STREQUAL local OR NOT decoded MATCHES "entries crc32c")
  message(FATAL_ERROR "the restored sequence did not continue as the local one:\ndecode: ${decoded}local:  ${local}")
endif()
execute_process(COMMAND "${PROGRAM}" decode "${file}" --steps 1 --layers 5 RESULT_VARIABLE status ERROR_VARIABLE err)
if(status EQUAL 0 OR NOT err MATCHES "layer count")
  message(FATAL_ERROR "a 5-layer model took a 4-layer snapshot (status ${status}): ${err}")
endif()
file(REMOVE "${file}")
