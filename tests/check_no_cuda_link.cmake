# Fails when BINARY links libcuda or libnvrtc: both are only ever dlopen'ed, so that everything
# but launching works without a driver, and kjit finds NVRTC wherever it is installed (a pip
# wheel, a toolkit) instead of where the build machine had it.
execute_process(COMMAND readelf -d ${BINARY} OUTPUT_VARIABLE dynamic RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "readelf -d ${BINARY} failed")
endif()
if(dynamic MATCHES "libcuda\\.so|libnvrtc")
  message(FATAL_ERROR "${BINARY} links libcuda or libnvrtc:\n${dynamic}")
endif()
message(STATUS "${BINARY}: neither libcuda nor libnvrtc in its dynamic section")
