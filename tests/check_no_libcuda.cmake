# Fails when BINARY links libcuda: the driver must only ever be dlopen'ed, so that everything but
# launching works on machines without one.
execute_process(COMMAND readelf -d ${BINARY} OUTPUT_VARIABLE dynamic RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed")
endif()
if(dynamic MATCHES "libcuda\\.so")
  message(FATAL_ERROR "${BINARY} links libcuda:\n${dynamic}")
endif()
message(STATUS "${BINARY}: no libcuda in its dynamic section")
