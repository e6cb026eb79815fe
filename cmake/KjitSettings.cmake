# Build settings as INTERFACE targets, linked PRIVATE: no global flags.
include_guard(GLOBAL)

add_library(kjit_settings INTERFACE)
target_compile_features(kjit_settings INTERFACE cxx_std_20)

option(KJIT_SANITIZE "Build with AddressSanitizer and UndefinedBehaviorSanitizer" OFF)
if(KJIT_SANITIZE)
  target_compile_options(kjit_settings INTERFACE
    $<BUILD_INTERFACE:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(kjit_settings INTERFACE $<BUILD_INTERFACE:-fsanitize=address,undefined>)
endif()

option(KJIT_BUILD_FUZZERS "Build the libFuzzer targets (clang; with KJIT_SANITIZE)" OFF)
if(KJIT_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "KJIT_BUILD_FUZZERS needs clang (CXX=clang++)")
  endif()
  # Coverage instrumentation for the library code the fuzzers reach.
  target_compile_options(kjit_settings INTERFACE $<BUILD_INTERFACE:-fsanitize=fuzzer-no-link>)
endif()

add_library(kjit_warnings INTERFACE)
option(KJIT_WERROR "Treat warnings as errors" OFF)
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(kjit_warnings INTERFACE
    $<BUILD_INTERFACE:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
      -Wcast-align -Wunused -Woverloaded-virtual -Wdouble-promotion
      -Wformat=2 -Wimplicit-fallthrough
      -Wno-missing-field-initializers>
    $<$<BOOL:${KJIT_WERROR}>:$<BUILD_INTERFACE:-Werror>>)
endif()

# Designated initializers (RuntimeOptions{.cache_dir = ...}) leave the other fields defaulted on
# purpose: -Wmissing-field-initializers is off.

# clang-format targets over the project's own sources.
find_program(KJIT_CLANG_FORMAT clang-format)
if(KJIT_CLANG_FORMAT)
  file(GLOB_RECURSE KJIT_FORMAT_SOURCES CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/include/*.hpp ${PROJECT_SOURCE_DIR}/runtime/*.[ch]pp
    ${PROJECT_SOURCE_DIR}/cache/*.[ch]pp ${PROJECT_SOURCE_DIR}/tools/*.[ch]pp
    ${PROJECT_SOURCE_DIR}/tests/*.[ch]pp ${PROJECT_SOURCE_DIR}/examples/*.[ch]pp
    ${PROJECT_SOURCE_DIR}/bench/*.[ch]pp ${PROJECT_SOURCE_DIR}/python_bindings/*.[ch]pp)
  add_custom_target(format COMMAND ${KJIT_CLANG_FORMAT} -i ${KJIT_FORMAT_SOURCES}
    COMMENT "clang-format: rewriting sources")
  add_custom_target(check_format COMMAND ${KJIT_CLANG_FORMAT} --dry-run --Werror ${KJIT_FORMAT_SOURCES}
    COMMENT "clang-format: checking sources")
endif()
