# Installs kjit from the current build, then builds and runs the consumer app twice: through
# find_package on the installed tree and through add_subdirectory on the source tree. The
# subproject builds as this build did (BUILD_TYPE, WERROR), so a compiler cache serves its files.
foreach(variable KJIT_SOURCE_DIR KJIT_BINARY_DIR WORK_DIR GENERATOR BUILD_TYPE WERROR)
  if(NOT DEFINED ${variable})
    message(FATAL_ERROR "run.cmake needs -D${variable}=...")
  endif()
endforeach()

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
run(${CMAKE_COMMAND} --install ${KJIT_BINARY_DIR} --prefix ${WORK_DIR}/prefix)

run(${CMAKE_COMMAND} -S ${KJIT_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/find_package
  -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DKJIT_CONSUMER_MODE=find_package)
run(${CMAKE_COMMAND} --build ${WORK_DIR}/find_package)
run(${WORK_DIR}/find_package/consumer)

run(${CMAKE_COMMAND} -S ${KJIT_SOURCE_DIR}/tests/consumer -B ${WORK_DIR}/add_subdirectory
  -G ${GENERATOR} -DKJIT_CONSUMER_MODE=add_subdirectory -DKJIT_SOURCE_DIR=${KJIT_SOURCE_DIR}
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DKJIT_WERROR=${WERROR})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/add_subdirectory)
run(${WORK_DIR}/add_subdirectory/consumer)
